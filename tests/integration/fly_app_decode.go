// Decodes Souq's answers to the app routes into the types a Fly Machines-API client declares
// for them (field names and Go types as in the API's contract), with encoding/json, as such a
// client does. Reads {"kind": "app"|"list", "body": ...} lines on stdin; prints "ok" or the
// decode error for each.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

type organization struct {
	Name              string `json:"name"`
	Slug              string `json:"slug"`
	InternalNumericID int32  `json:"internal_numeric_id"`
}

type app struct {
	ID                string       `json:"id"`
	Name              string       `json:"name"`
	InternalNumericID int32        `json:"internal_numeric_id"`
	Network           string       `json:"network"`
	Status            string       `json:"status"`
	MachineCount      int64        `json:"machine_count"`
	VolumeCount       int64        `json:"volume_count"`
	Organization      organization `json:"organization"`
	CnameTarget       string       `json:"cname_target"`
	AppRole           string       `json:"app_role"`
}

type appList struct {
	Apps []app `json:"apps"`
}

type errorBody struct {
	Error  string `json:"error"`
	Status string `json:"status"`
}

type input struct {
	Kind string          `json:"kind"`
	Body json.RawMessage `json:"body"`
}

func main() {
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		var in input
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			fmt.Println("bad input:", err)
			continue
		}
		var err error
		var out interface{}
		switch in.Kind {
		case "app":
			var a app
			err = json.Unmarshal(in.Body, &a)
			out = a
		case "list":
			var l appList
			err = json.Unmarshal(in.Body, &l)
			out = l
		case "error":
			var e errorBody
			err = json.Unmarshal(in.Body, &e)
			out = e
		default:
			err = fmt.Errorf("unknown kind %q", in.Kind)
		}
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		encoded, _ := json.Marshal(out)
		fmt.Println("ok", string(encoded))
	}
}
