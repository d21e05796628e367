// Package docs holds the documentation; its test keeps the links between
// the pages whole.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
	dropRE    = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// anchor is the fragment GitHub gives a heading.
func anchor(h string) string {
	return strings.ReplaceAll(dropRE.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// TestLinks: every relative link of the README and the pages here names a
// file that exists and, with a fragment, a heading in it.
func TestLinks(t *testing.T) {
	pages, _ := filepath.Glob("*.md")
	pages = append(pages, "../README.md")
	anchors := map[string]map[string]bool{}
	heads := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		a := map[string]bool{}
		if err == nil {
			for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(b), ""), -1) {
				a[anchor(m[1])] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(b), ""), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(link, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: link %s: no such file", page, link)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(target, ".md") && !heads(target)[frag] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", page, link, target)
			}
		}
	}
}
