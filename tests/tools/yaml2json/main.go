// Command yaml2json reads YAML exactly as kubectl and Helm do (sigs.k8s.io/yaml over go-yaml v2) and prints
// it as JSON: the reference that Windvane's own YAML reader is compared with in a differential test
// (shared/tests/yaml_kubectl.rs). Input on stdin: YAML documents separated by NUL bytes. Output: one line per
// document, {"json": <the document as JSON>} or {"error": "<the reader's message>"}.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		os.Stderr.WriteString("reading stdin: " + err.Error() + "\n")
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	encoder := json.NewEncoder(out)
	for _, document := range bytes.Split(input, []byte{0}) {
		converted, err := yaml.YAMLToJSON(document)
		var line any
		if err != nil {
			line = map[string]string{"error": err.Error()}
		} else {
			line = map[string]json.RawMessage{"json": converted}
		}
		if err := encoder.Encode(line); err != nil {
			os.Stderr.WriteString("writing stdout: " + err.Error() + "\n")
			os.Exit(2)
		}
	}
}
