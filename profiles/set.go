package profiles

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
)

//go:embed *.yaml
var embedded embed.FS

// ErrUnknownProfile is wrapped by Lookup when no profile has the name.
var ErrUnknownProfile = errors.New("unknown profile")

// ErrDuplicateProfile is wrapped when a profile's name or alias is already
// taken by another profile of the set.
var ErrDuplicateProfile = errors.New("duplicate profile name")

// Decode strictly decodes one profile file and validates it. Unknown
// fields, a second YAML document and bad quantities are decode errors;
// otherwise every validation problem is returned (each a *FieldError
// with Source set). source names the file in errors.
func Decode(data []byte, source string) (*Profile, error) {
	// 1. Decode exactly one document, rejecting unknown fields.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p Profile
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("profiles: decode %s: empty file", source)
		}
		return nil, fmt.Errorf("profiles: decode %s: %w", source, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("profiles: decode %s: after the first document: %w", source, err)
		}
		return nil, fmt.Errorf("profiles: decode %s: more than one YAML document (line %d); a file holds one profile", source, extra.Line)
	}
	// 2. Validate, naming the file in every problem.
	fes := p.validate()
	for _, fe := range fes {
		fe.Source = source
	}
	if err := joinFieldErrors(fes); err != nil {
		return nil, err
	}
	return &p, nil
}

// Set is a collection of validated profiles, looked up by name or alias.
// Names and aliases share one namespace: no name or alias is ever
// resolved two ways. Lookup is safe for concurrent use; LoadDir is not
// safe concurrently with anything.
type Set struct {
	profiles map[string]*Profile // by name
	aliases  map[string]string   // alias -> name
	sources  map[string]string   // name -> file it came from

	// The embedded profiles are decoded when first needed: a Lookup by
	// name decodes that one file only (`str run` pays for one profile,
	// not four); anything that needs the whole set decodes it all.
	mu      sync.Mutex
	pending fs.FS               // embedded files not loaded into the tables yet
	single  map[string]*Profile // embedded profiles decoded one by one
}

func newSet() *Set {
	return &Set{profiles: map[string]*Profile{}, aliases: map[string]string{}, sources: map[string]string{}}
}

// Embedded returns a new Set holding the profiles compiled into str:
// restrictive (alias untrusted), standard, permissive (alias trusted) and
// confidential. Decoding is lazy (see Set); TestEmbeddedFilesDecodeAndValidate
// keeps the files valid, so the error is for a broken build only.
func Embedded() (*Set, error) {
	s := newSet()
	s.pending = embedded
	s.single = map[string]*Profile{}
	return s, nil
}

// loadAll decodes the pending embedded profiles into the tables.
func (s *Set) loadAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return nil
	}
	fsys := s.pending
	s.pending, s.single = nil, nil
	return s.loadFS(fsys, ".", "embedded:")
}

// lookupSingle decodes the embedded file NAME.yaml alone, when the set's
// embedded part is still pending and name is a profile's own name.
func (s *Set) lookupSingle(name string) (*Profile, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return nil, false
	}
	if p, ok := s.single[name]; ok {
		return p.clone(), true
	}
	if !validFileName(name) {
		return nil, false
	}
	data, err := fs.ReadFile(s.pending, name+".yaml")
	if err != nil {
		return nil, false
	}
	p, ok := fromPredecoded(predecodedFS, name, data)
	if !ok {
		var err error
		if p, err = Decode(data, "embedded:"+name+".yaml"); err != nil || p.Name != name {
			return nil, false // the full load reports it
		}
	}
	s.single[name] = p
	return p.clone(), true
}

func validFileName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\\.\x00")
}

// LoadDir adds every *.yaml file of dir (not recursive) to the set. Every
// problem of every file is collected; a name or alias that collides with
// one already in the set (or in another file) is an error, never a silent
// override. When anything is wrong nothing is added.
func (s *Set) LoadDir(dir string) error {
	if err := s.loadAll(); err != nil {
		return err
	}
	return s.loadFS(os.DirFS(dir), dir, "")
}

// loadFS decodes all *.yaml files of fsys and adds them all, or none.
// prefix is prepended to file names in errors (dir or "embedded:").
func (s *Set) loadFS(fsys fs.FS, dir, prefix string) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return fmt.Errorf("profiles: read directory %s: %w", dir, err)
	}
	var errs []error
	var loaded []*Profile
	var sources []string
	for _, e := range entries { // fs.ReadDir sorts by name
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		source := prefix + e.Name()
		if prefix == "" {
			source = filepath.Join(dir, e.Name())
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("profiles: read %s: %w", source, err))
			continue
		}
		p, err := Decode(data, source)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if want := strings.TrimSuffix(e.Name(), ".yaml"); p.Name != want {
			errs = append(errs, fmt.Errorf("profiles: %s: holds profile %q; the file must be named %s.yaml", source, p.Name, p.Name))
			continue
		}
		loaded = append(loaded, p)
		sources = append(sources, source)
	}
	// Check collisions against the set and among the new files, in one
	// scratch copy of the name tables, so that a failure adds nothing.
	next := &Set{profiles: maps.Clone(s.profiles), aliases: maps.Clone(s.aliases), sources: maps.Clone(s.sources)}
	for i, p := range loaded {
		if err := next.add(p, sources[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.profiles, s.aliases, s.sources = next.profiles, next.aliases, next.sources
	return nil
}

// add puts p into s, refusing any name or alias already resolved by s.
func (s *Set) add(p *Profile, source string) error {
	var errs []error
	for _, n := range append([]string{p.Name}, p.Aliases...) {
		if owner, ok := s.resolve(n); ok {
			what := "name"
			if n != owner {
				what = "alias"
			}
			errs = append(errs, fmt.Errorf("profiles: %s: profile %s: %q is already the %s of profile %s (from %s): %w",
				source, p.Name, n, what, owner, s.sources[owner], ErrDuplicateProfile))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.profiles[p.Name] = p
	s.sources[p.Name] = source
	for _, a := range p.Aliases {
		s.aliases[a] = p.Name
	}
	return nil
}

// canonical maps a name or alias to a canonical name, loading the whole
// set first (for callers outside the loading path).
func (s *Set) canonical(name string) (string, bool) {
	_ = s.loadAll() // an error here is Lookup's to report
	return s.resolve(name)
}

// resolve maps a name or alias to a canonical name.
func (s *Set) resolve(name string) (string, bool) {
	if _, ok := s.profiles[name]; ok {
		return name, true
	}
	n, ok := s.aliases[name]
	return n, ok
}

// Lookup returns a copy of the profile with this name or alias; the
// caller may change it without affecting the set.
func (s *Set) Lookup(name string) (*Profile, error) {
	if p, ok := s.lookupSingle(name); ok {
		return p, nil
	}
	if err := s.loadAll(); err != nil {
		return nil, err
	}
	if canon, ok := s.resolve(name); ok {
		return s.profiles[canon].clone(), nil
	}
	var aliases []string
	for _, a := range sortedKeys(s.aliases) {
		aliases = append(aliases, a+"->"+s.aliases[a])
	}
	return nil, fmt.Errorf("profiles: %w %q (profiles: %s; aliases: %s)",
		ErrUnknownProfile, name, strings.Join(s.Names(), ", "), strings.Join(aliases, ", "))
}

// Names returns the canonical profile names, sorted.
func (s *Set) Names() []string {
	_ = s.loadAll() // an error here is Lookup's to report
	return sortedKeys(s.profiles)
}

// Aliases returns a copy of the alias table (alias -> canonical name).
func (s *Set) Aliases() map[string]string {
	_ = s.loadAll()
	return maps.Clone(s.aliases)
}

// Source names the file a profile came from ("embedded:standard.yaml" or
// a path under a LoadDir directory), or "" for an unknown name.
func (s *Set) Source(name string) string {
	_ = s.loadAll()
	canon, _ := s.resolve(name)
	return s.sources[canon]
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
