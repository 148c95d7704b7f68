package profileyaml

import (
	"reflect"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/profiles"
)

// TestSameFields: this package's types have exactly the fields (names,
// order, YAML keys) of package profiles', and kinds that encode to the
// same JSON, so that the decoded form of a file is a profiles.Profile.
func TestSameFields(t *testing.T) {
	var walk func(path string, ours, theirs reflect.Type)
	walk = func(path string, ours, theirs reflect.Type) {
		if ours == theirs {
			return
		}
		if ours.Kind() != theirs.Kind() {
			t.Errorf("%s: kind %s here, %s in package profiles", path, ours.Kind(), theirs.Kind())
			return
		}
		switch ours.Kind() {
		case reflect.Slice, reflect.Pointer:
			walk(path+"[]", ours.Elem(), theirs.Elem())
		case reflect.Struct:
			if ours.Name() != theirs.Name() && ours.Name() != "" {
				t.Errorf("%s: type %s here, %s in package profiles (yaml.v3's messages name it)", path, ours.Name(), theirs.Name())
			}
			if ours.NumField() != theirs.NumField() {
				t.Errorf("%s: %d fields here, %d in package profiles", path, ours.NumField(), theirs.NumField())
				return
			}
			for i := range ours.NumField() {
				a, b := ours.Field(i), theirs.Field(i)
				if a.Name != b.Name || a.Tag.Get("yaml") != b.Tag.Get("yaml") {
					t.Errorf("%s: field %d is %s `yaml:%q` here, %s `yaml:%q` in package profiles", path, i, a.Name, a.Tag.Get("yaml"), b.Name, b.Tag.Get("yaml"))
					continue
				}
				walk(path+"."+a.Name, a.Type, b.Type)
			}
		}
	}
	walk("Profile", reflect.TypeFor[Profile](), reflect.TypeFor[profiles.Profile]())
}

// The messages of yaml.v3 name package profiles' types, as they did when
// the decoder was there.
func TestMessagesNameProfilesTypes(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{validYAML + "bogus: 1\n", "field bogus not found in type profiles.Profile"},
		{strings.Replace(validYAML, "  dev_shm: 0\n", "  dev_shm: 0\n  rw_binds: []\n", 1), "field rw_binds not found in type profiles.Mounts"},
		{strings.Replace(validYAML, "work_dir: {size: 64Mi, inodes: 1000}", "work_dir: [1]", 1), "into profiles.WorkDir"},
	} {
		_, err := Decode([]byte(tc.yaml), "x.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "profileyaml") {
			t.Errorf("error %v, want it to contain %q", err, tc.want)
		}
	}
}
