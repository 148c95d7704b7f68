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
// resolved two ways. A Set is not safe for concurrent LoadDir and Lookup.
type Set struct {
	profiles map[string]*Profile // by name
	aliases  map[string]string   // alias -> name
	sources  map[string]string   // name -> file it came from
}

func newSet() *Set {
	return &Set{profiles: map[string]*Profile{}, aliases: map[string]string{}, sources: map[string]string{}}
}

// Embedded returns a new Set holding the profiles compiled into str:
// restrictive (alias untrusted), standard, permissive (alias trusted) and
// confidential.
func Embedded() (*Set, error) {
	s := newSet()
	if err := s.loadFS(embedded, ".", "embedded:"); err != nil {
		return nil, err
	}
	return s, nil
}

// LoadDir adds every *.yaml file of dir (not recursive) to the set. Every
// problem of every file is collected; a name or alias that collides with
// one already in the set (or in another file) is an error, never a silent
// override. When anything is wrong nothing is added.
func (s *Set) LoadDir(dir string) error {
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
	*s = *next
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
func (s *Set) Names() []string { return sortedKeys(s.profiles) }

// Aliases returns a copy of the alias table (alias -> canonical name).
func (s *Set) Aliases() map[string]string { return maps.Clone(s.aliases) }

// Source names the file a profile came from ("embedded:standard.yaml" or
// a path under a LoadDir directory), or "" for an unknown name.
func (s *Set) Source(name string) string {
	canon, _ := s.resolve(name)
	return s.sources[canon]
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
