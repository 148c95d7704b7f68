// Command kubeschema validates Kubernetes manifests offline against the
// API's own types, as the API server's strict decoding does: every document
// of every file is decoded into the Go type its apiVersion and kind name
// (k8s.io/api, the types the API's OpenAPI schema is generated from), with
// unknown and duplicate fields refused (strict mode), quantities and
// int-or-string values parsed, and a kind it does not know refused. Then
// the decoded object is encoded again and compared with the input, so a
// field the type silently dropped is reported too.
//
//	kubeschema FILE.yaml...
//
// A module of its own (test/pod/kubeschema/go.mod) so that str's module
// does not depend on the Kubernetes libraries; test/pod runs it
// (TestKubernetesSchema).
//
// Why not kubeconform: it fetches the JSON schemas from the network at run
// time, which CI does not reach; the schemas it would fetch are generated
// from these same types.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubeschema FILE.yaml...")
		os.Exit(2)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, autoscalingv2.AddToScheme} {
		if err := add(scheme); err != nil {
			fmt.Fprintln(os.Stderr, "kubeschema:", err)
			os.Exit(2)
		}
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{Yaml: true, Strict: true})
	bad := 0
	for _, f := range os.Args[1:] {
		n, err := validateFile(f, strict)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			bad++
			continue
		}
		fmt.Printf("%s: %d documents valid\n", f, n)
	}
	if bad > 0 {
		os.Exit(1)
	}
}

func validateFile(path string, strict *json.Serializer) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	r := utilyaml.NewYAMLReader(bufioReader(data))
	n := 0
	var problems []error
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("%s document %d: %w", path, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s document %d: %w", path, i, err))
			continue
		}
		// Round trip: what the type kept must be all the document said.
		out, err := yaml.Marshal(obj)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s document %d (%s): encode: %w", path, i, gvk.Kind, err))
			continue
		}
		var in, back map[string]any
		if err := yaml.Unmarshal(doc, &in); err != nil {
			problems = append(problems, fmt.Errorf("%s document %d: %w", path, i, err))
			continue
		}
		if err := yaml.Unmarshal(out, &back); err != nil {
			problems = append(problems, fmt.Errorf("%s document %d: %w", path, i, err))
			continue
		}
		if missing := lost(in, back, ""); missing != "" {
			problems = append(problems, fmt.Errorf("%s document %d (%s): %s does not survive decoding", path, i, gvk.Kind, missing))
			continue
		}
		n++
	}
	return n, errors.Join(problems...)
}

// lost returns the first path of in that back lacks or holds differently
// ("" when none). Values are compared after both went through YAML, so
// "4608Mi" and a quantity encoded as "4608Mi" are equal.
func lost(in, back any, path string) string {
	switch v := in.(type) {
	case map[string]any:
		if len(v) == 0 && back == nil {
			return ""
		}
		b, ok := back.(map[string]any)
		if !ok {
			return path
		}
		for k, x := range v {
			if p := lost(x, b[k], path+"."+k); p != "" {
				return p
			}
		}
		return ""
	case []any:
		if len(v) == 0 && back == nil {
			return "" // an empty list is omitted when encoded
		}
		b, ok := back.([]any)
		if !ok || len(b) != len(v) {
			return path
		}
		for i := range v {
			if p := lost(v[i], b[i], fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(in, back) && fmt.Sprint(in) != fmt.Sprint(back) {
			return path
		}
		return ""
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// stripComments drops comment lines, to tell a document of comments only.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
