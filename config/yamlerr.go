package config

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"
)

// yamlLine reads the line yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// yamlError is a YAML syntax error of data as the rules' errors say it:
// the fault's line, and yaml.v3's message without its own line number.
// That number is the line where the construct around the fault began
// (the mapping a misindented key breaks, the scalar a tab follows), or
// the line before the fault: so the fault's line is found as the
// shortest prefix of data, in whole lines, that fails with the same
// error as the whole, by bisection (the parser stops at the first
// fault: every longer prefix fails alike, every shorter one otherwise).
func yamlError(data []byte, err error) (line int, msg string) {
	msg = err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return 0, msg
	}
	msg = msg[len(m[0]):]
	if len(data) > maxBisectBytes {
		reported, _ := strconv.Atoi(m[1])
		return reported, msg
	}
	ends := lineEnds(data)
	lo, hi := 0, len(ends) // the fault's line is in (lo, hi]
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if e := firstYAMLError(data[:ends[mid-1]]); e != nil && e.Error() == err.Error() {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, msg
}

// maxBisectBytes bounds the files whose faults are found by bisection
// (a score of parses at most): a larger one names yaml.v3's line.
const maxBisectBytes = 1 << 20

// lineEnds are the offsets just past each line of data (the last line's
// end is data's, with or without a newline).
func lineEnds(data []byte) []int {
	var ends []int
	for i := 0; i < len(data); {
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			ends = append(ends, len(data))
			break
		}
		i += j + 1
		ends = append(ends, i)
	}
	return ends
}

// firstYAMLError decodes every document of data and returns the first
// syntax error, nil for none.
func firstYAMLError(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
