package profiles

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/internal/predecoded"
)

// The embedded profiles' YAML is in str only for the check that each
// decoded form (predecoded/NAME.json) was made from it.
//
//go:embed *.yaml
var embedded embed.FS

// ErrUnknownProfile is wrapped by Lookup when no profile has the name.
var ErrUnknownProfile = errors.New("unknown profile")

// ErrDuplicateProfile is wrapped when a profile's name or alias is already
// taken by another profile of the set.
var ErrDuplicateProfile = errors.New("duplicate profile name")

// Decoded is one profile file in its decoded form: the profile and the
// file it came from. A JSON list of them is what package profileyaml
// makes of an operator's profile directory and what Set.AddDecoded reads;
// the Profile's own JSON (Go field names, quantities as numbers) is also
// the form go generate stores for the embedded files (predecoded/).
type Decoded struct {
	Source  string   `json:"source"`
	Profile *Profile `json:"profile"`
}

// ReadDecoded reads one profile in its decoded form (JSON of a Profile),
// refusing unknown fields, and validates it; source names the file it
// came from in every problem.
func ReadDecoded(data []byte, source string) (*Profile, error) {
	var p Profile
	if err := strictJSON(data, &p); err != nil {
		return nil, fmt.Errorf("profiles: %s: decoded form: %w", source, err)
	}
	if err := p.validateFrom(source); err != nil {
		return nil, err
	}
	return &p, nil
}

func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one value")
	}
	return nil
}

// validateFrom is Validate with source named in every problem.
func (p *Profile) validateFrom(source string) error {
	fes := p.validate()
	for _, fe := range fes {
		fe.Source = source
	}
	return joinFieldErrors(fes)
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
	return s.loadEmbedded(fsys)
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
		return nil, false // the full load reports it
	}
	s.single[name] = p
	return p.clone(), true
}

func validFileName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\\.\x00")
}

// AddDecoded adds the profiles of an operator's profile directory, in
// their decoded form (a JSON list of Decoded, as package profileyaml
// makes it), to the set: each is validated again, and a name or alias
// that collides with one already in the set (or in another file) is an
// error, never a silent override. When anything is wrong nothing is added.
func (s *Set) AddDecoded(data []byte) error {
	var files []Decoded
	if err := strictJSON(data, &files); err != nil {
		return fmt.Errorf("profiles: decoded profile directory: %w", err)
	}
	var errs []error
	for _, f := range files {
		if f.Profile == nil {
			errs = append(errs, fmt.Errorf("profiles: %s: decoded form without a profile", f.Source))
		} else if err := f.Profile.validateFrom(f.Source); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.Add(files)
}

// Add adds decoded, validated profiles to the set, all or none: a name or
// alias already resolved by the set or by another of files is an error
// (ErrDuplicateProfile), every collision reported.
func (s *Set) Add(files []Decoded) error {
	if err := s.loadAll(); err != nil {
		return err
	}
	return s.addAll(files)
}

// addAll is Add once the embedded profiles are in the tables.
func (s *Set) addAll(files []Decoded) error {
	// Check collisions against the set and among the new files, in one
	// scratch copy of the name tables, so that a failure adds nothing.
	next := &Set{profiles: maps.Clone(s.profiles), aliases: maps.Clone(s.aliases), sources: maps.Clone(s.sources)}
	var errs []error
	for _, f := range files {
		if err := next.add(f.Profile, f.Source); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.profiles, s.aliases, s.sources = next.profiles, next.aliases, next.sources
	return nil
}

// loadEmbedded reads the decoded form of every embedded profile into the
// tables; a missing or stale one is a build defect (go generate).
func (s *Set) loadEmbedded(fsys fs.FS) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return fmt.Errorf("profiles: read embedded profiles: %w", err)
	}
	var errs []error
	var files []Decoded
	for _, e := range entries { // fs.ReadDir sorts by name
		name, ok := strings.CutSuffix(e.Name(), ".yaml")
		if e.IsDir() || !ok {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("profiles: read embedded:%s: %w", e.Name(), err))
			continue
		}
		p, ok := fromPredecoded(predecodedFS, name, data)
		if !ok {
			errs = append(errs, fmt.Errorf("profiles: embedded:%s: its decoded form %s is missing, stale or invalid: run go generate ./profiles", e.Name(), predecoded.Path(name)))
			continue
		}
		files = append(files, Decoded{Source: "embedded:" + e.Name(), Profile: p})
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.addAll(files)
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
