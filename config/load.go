package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// MaxFileSize bounds one rules file; a larger file is refused rather than
// read into memory.
const MaxFileSize = 16 << 20

// Load reads, validates and compiles the rules at paths. Each path is a
// file or a directory, of which every *.yaml and *.yml file is read
// (not recursively; names starting with '.' are skipped, as editors and
// Kubernetes ConfigMap mounts leave such entries). Files load in sorted
// order. Every problem of every file is returned, joined; a snapshot is
// returned only when there are none.
func Load(paths ...string) (*Snapshot, error) {
	files, err := listFiles(paths)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{domains: map[string]*Domain{}, Files: files, LoadedAt: time.Now()}
	h := sha256.New()
	var errs []error
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
		d, err := parseFile(f, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := snap.domains[d.Name]; dup {
			errs = append(errs, &Error{File: f, Msg: fmt.Sprintf("duplicate domain %q (already defined in %s)", d.Name, prev.File)})
			continue
		}
		snap.domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	snap.Hash = hex.EncodeToString(h.Sum(nil))
	return snap, nil
}

// Parse compiles one rules document held in memory; name stands for the
// file in errors. It is what [Load] does for each file.
func Parse(name string, data []byte) (*Snapshot, error) {
	d, err := parseFile(name, data)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &Snapshot{domains: map[string]*Domain{d.Name: d}, Files: []string{name},
		Hash: hex.EncodeToString(sum[:]), LoadedAt: time.Now()}, nil
}

func readFile(f string) ([]byte, error) {
	fh, err := os.Open(f)
	if err != nil {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	if st.Size() > MaxFileSize {
		return nil, &Error{File: f, Msg: fmt.Sprintf("file is %d bytes, more than the %d allowed", st.Size(), MaxFileSize)}
	}
	data := make([]byte, st.Size())
	if _, err := fh.ReadAt(data, 0); err != nil && st.Size() > 0 {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	return data, nil
}

func listFiles(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, errors.New("config: no rules path given")
	}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		var found []string
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
				continue
			}
			full := filepath.Join(p, name)
			if st, err := os.Stat(full); err != nil || st.IsDir() {
				continue // a dangling symlink or a directory named *.yaml
			}
			found = append(found, full)
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("config: %s: no *.yaml or *.yml rules files in directory", p)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	return files, nil
}
