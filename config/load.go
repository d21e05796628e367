package config

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Load reads, validates and compiles the rules at paths. Each path is a
// file or a directory, of which every *.yaml and *.yml file is read
// (not recursively; names starting with '.' are skipped, as editors and
// Kubernetes ConfigMap mounts leave such entries). Files load in sorted
// order. Every problem of every file is returned, joined; a snapshot is
// returned only when there are none. Each file is parsed within the
// bounds of [MaxFileSize], [MaxYAMLNodes], [MaxWalkNodes] and the rest.
func Load(paths ...string) (*Snapshot, error) {
	return LoadContext(context.Background(), paths...)
}

// LoadContext is [Load], stopped early (with an error) once ctx is done:
// a reload that a newer change makes moot need not finish.
func LoadContext(ctx context.Context, paths ...string) (*Snapshot, error) {
	return LoadWith(ctx, Options{}, paths...)
}

// Options change how a set of rules files is read.
type Options struct {
	// MergeDomains merges files that share a domain, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does: their top-level
	// descriptors form one domain, and a descriptor two files define is
	// an error naming both. Without it a domain in two files is an error.
	MergeDomains bool
	// GlobalDomains names the domains every limit of which is global
	// (rate_limit.global: one limit across regions), however they are
	// served: a name, or a prefix ending in '*'. It reaches rules that
	// cannot say so themselves (those Envoy Gateway and Envoy AI Gateway
	// serve over xDS); a limit there that cannot be global is an error.
	GlobalDomains []string
}

// globalDomain reports whether domain is one of patterns.
func globalDomain(patterns []string, domain string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(domain, prefix) || p == domain {
			return true
		}
	}
	return false
}

// makeGlobal marks every limit of d global, for GlobalDomains; it
// returns an error per limit that cannot be.
func makeGlobal(d *Domain) []error {
	var errs []error
	for _, r := range d.rules {
		l := r.Limit
		switch {
		case l == nil || l.Unlimited || l.Global:
		case l.Algorithm != AlgorithmFixedWindow || l.Lease || l.Calendar:
			errs = append(errs, &Error{File: r.File, Line: r.Line,
				Msg: fmt.Sprintf("rule %s: domain %q is global (--global-domains), and a global limit needs algorithm fixed_window, no lease and no calendar", r.Path, d.Name)})
		default:
			l.Global = true
		}
	}
	return errs
}

// LoadWith is [LoadContext] with opts.
func LoadWith(ctx context.Context, opts Options, paths ...string) (*Snapshot, error) {
	files, err := listFiles(paths)
	if err != nil {
		return nil, err
	}
	docs := make([]Doc, 0, len(files))
	var errs []error
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("config: load stopped before %s: %w", f, err)
		}
		data, err := readFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// The hash names a file as the rules root does (a directory's
		// files are its own, not its subdirectories'): check-config in
		// CI and the server agree however the path is spelled.
		docs = append(docs, Doc{Name: f, HashName: filepath.Base(f), Data: data, Lines: true})
	}
	snap, err := LoadDocs(ctx, opts, docs)
	if err != nil || len(errs) > 0 {
		return nil, errors.Join(append(errs, err)...)
	}
	return snap, nil
}

// Doc is one rules document held in memory: a file's contents, or a
// resource received over xDS rendered in the rules format.
type Doc struct {
	// Name stands for the file in errors and in [Snapshot.Files].
	Name string
	// HashName stands for the document in [Snapshot.Hash]; empty means
	// Name. A file's is its name relative to the rules root, so that
	// the hash does not depend on how the path was spelled.
	HashName string
	Data     []byte
	// Lines says whether line numbers in Data mean something to the
	// reader: they do in a file, not in a rendered resource, whose
	// errors then name only the path in the document.
	Lines bool
}

// LoadDocs validates and compiles docs as one set, exactly as [LoadWith]
// does files: every problem of every document is returned, joined, and
// a snapshot only when there are none.
func LoadDocs(ctx context.Context, opts Options, docs []Doc) (*Snapshot, error) {
	snap := &Snapshot{domains: map[string]*Domain{}, LoadedAt: time.Now()}
	h := sha256.New()
	var errs []error
	for _, doc := range docs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("config: load stopped before %s: %w", doc.Name, err)
		}
		snap.Files = append(snap.Files, doc.Name)
		fmt.Fprintf(h, "%s\x00%d\x00", cmp.Or(doc.HashName, doc.Name), len(doc.Data))
		h.Write(doc.Data)
		ds, err := parseDoc(ctx, doc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !doc.Lines {
			for _, d := range ds {
				d.Line = 0 // a rendered resource's lines mean nothing to its reader
			}
		}
		for _, d := range ds {
			if prev, dup := snap.domains[d.Name]; dup {
				if !opts.MergeDomains {
					errs = append(errs, &Error{File: doc.Name, Line: d.Line,
						Msg: fmt.Sprintf("duplicate domain %q (already defined %s; --merge-domains merges them)", d.Name, where(prev.File, prev.Line))})
					continue
				}
				errs = append(errs, prev.merge(d)...)
				continue
			}
			snap.domains[d.Name] = d
		}
	}
	for _, name := range snap.Domains() {
		if globalDomain(opts.GlobalDomains, name) {
			errs = append(errs, makeGlobal(snap.domains[name])...)
		}
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
	return LoadDocs(context.Background(), Options{}, []Doc{{Name: name, Data: data, Lines: true}})
}

func readFile(f string) ([]byte, error) {
	// Stat before opening: opening a FIFO blocks until a writer comes.
	st, err := os.Stat(f)
	if err != nil {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{File: f, Msg: fmt.Sprintf("not a regular file (%s)", st.Mode().Type())}
	}
	fh, err := os.Open(f)
	if err != nil {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	defer fh.Close()
	// Read at most one byte past the bound: the file may have grown.
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
	if err != nil {
		return nil, &Error{File: f, Msg: err.Error()}
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: f, Msg: fmt.Sprintf("file is more than the %d bytes allowed", MaxFileSize)}
	}
	return data, nil
}

func listFiles(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, errors.New("config: no rules path given")
	}
	var files []string
	var errs []error
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
			st, err := os.Stat(full)
			if err != nil {
				// A dangling symlink or a loop: skipping it would drop its
				// rules without a word.
				errs = append(errs, &Error{File: full, Msg: "unreadable rules file: " + err.Error()})
				continue
			}
			if st.IsDir() {
				continue // a directory named *.yaml
			}
			if !st.Mode().IsRegular() {
				errs = append(errs, &Error{File: full, Msg: fmt.Sprintf("not a regular file (%s)", st.Mode().Type())})
				continue
			}
			found = append(found, full)
		}
		if len(found) == 0 && len(errs) == 0 {
			return nil, fmt.Errorf("config: %s: no *.yaml or *.yml rules files in directory", p)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return files, nil
}

// where is "at file:line", or "in file" when the line is not known (a
// rendered resource).
func where(file string, line int) string {
	if line > 0 {
		return fmt.Sprintf("at %s:%d", file, line)
	}
	return "in " + file
}
