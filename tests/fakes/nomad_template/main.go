// Renders a Nomad `template` block's data with Go's own text/template, as Nomad's client does
// through consul-template, for the tests that play a job as a Nomad client would.
//
// The functions are those the rendered jobs use, with consul-template's types and behaviour:
// nomadVarExists (never blocks), nomadVar (blocks while the variable is missing: here an
// error, exit 3), env. A variable's items are NomadVarItems, a map of NomadVarItem whose String
// is the value (consul-template's dependency/nomad_var_structs.go).
//
// Input on stdin, JSON: {"template": "...", "variables": {"path": {"key": "value"}},
// "env": {"NAME": "value"}}. Output: the rendered text on stdout.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/template"
)

type NomadVarItem struct {
	Key, Value string
}

func (v NomadVarItem) String() string { return v.Value }

type NomadVarItems map[string]NomadVarItem

type input struct {
	Template  string                       `json:"template"`
	Variables map[string]map[string]string `json:"variables"`
	Env       map[string]string            `json:"env"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "input:", err)
		os.Exit(2)
	}
	funcs := template.FuncMap{
		"nomadVarExists": func(path string) bool {
			_, ok := in.Variables[path]
			return ok
		},
		"nomadVar": func(path string) (NomadVarItems, error) {
			items, ok := in.Variables[path]
			if !ok {
				return nil, fmt.Errorf("nomadVar %q: no such variable: the template blocks", path)
			}
			out := NomadVarItems{}
			for k, v := range items {
				out[k] = NomadVarItem{Key: k, Value: v}
			}
			return out, nil
		},
		"env": func(name string) string { return in.Env[name] },
	}
	tmpl, err := template.New("data").Funcs(funcs).Parse(in.Template)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parse:", err)
		os.Exit(2)
	}
	if err := tmpl.Execute(os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "execute:", err)
		os.Exit(3)
	}
}
