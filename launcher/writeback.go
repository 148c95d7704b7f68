package launcher

import (
	"github.com/securetoolruntime/str/launcher/writeback"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
)

// WriteBack is what step L10 did for a capped `str run --workdir`
// (Result.WriteBack).
type WriteBack = writeback.Report

// writeBack is a capped `str run --workdir`'s state from L3 (binds.go) to
// L10 (Sandbox.writeBack): package writeback does both.
type writeBack struct{ dir *writeback.Dir }

// overlayWorkDir is writeback.Overlay (part of L3).
func overlayWorkDir(tree int, m nsinit.Mount, wd profiles.WorkDir, toolUID, toolGID int) (int, *writeBack, error) {
	fd, dir, err := writeback.Overlay(tree, m, wd, toolUID, toolGID)
	if err != nil {
		return fd, nil, err
	}
	return fd, &writeBack{dir: dir}, nil
}

// run is step L10 (writeback.Dir.CopyBack).
func (wb *writeBack) run() *WriteBack { return wb.dir.CopyBack() }

// close lets go of a work dir whose sandbox never ran.
func (wb *writeBack) close() { wb.dir.Close() }
