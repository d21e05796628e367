// Package house holds the code base to the shape docs/ARCHITECTURE.md
// describes: the import floors, the size of a function and of a file. A
// change that breaks one of these rules fails here, not in a review.
package house

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	module = "github.com/ratelimitd/ratelimitd"
	root   = "../.."
	// maxFloor: the longest chain of our imports, a command included.
	maxFloor = 6
	// maxComplexity: a function's cyclomatic complexity, as gocyclo
	// counts it, outside tests.
	maxComplexity = 20
	// maxFileLines: a Go or Lua file's lines, tests included.
	maxFileLines = 500
	// maxLuaFunctionLines: a script's function, from its local function
	// line to its end.
	maxLuaFunctionLines = 40
)

// forbidden are imports that would pull a room up: the store stays below
// the rules format and the service's reports, RLQS beside the service.
var forbidden = map[string][]string{
	"internal/redisstore": {"config", "internal/record", "internal/metrics"},
	"internal/lease":      {"config", "internal/record", "internal/metrics"},
	"internal/rlqs":       {"internal/service", "internal/metrics"},
	"internal/xds":        {"internal/metrics"},
}

// TestImportFloors: a package's floor is one more than its highest
// import of ours; no floor is over maxFloor, and no forbidden import is
// made.
func TestImportFloors(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(l, ":")
		pkg = strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		for _, d := range strings.Fields(deps) {
			if rest, ok := strings.CutPrefix(d, module+"/"); ok {
				imports[pkg] = append(imports[pkg], rest)
			}
		}
		if _, ok := imports[pkg]; !ok {
			imports[pkg] = nil
		}
	}
	floors := map[string]int{}
	var floor func(p string, path []string) int
	floor = func(p string, path []string) int {
		if f, ok := floors[p]; ok {
			return f
		}
		if slices.Contains(path, p) {
			t.Fatalf("import cycle: %s", strings.Join(append(path, p), " -> "))
		}
		f := 1
		for _, d := range imports[p] {
			f = max(f, 1+floor(d, append(path, p)))
		}
		floors[p] = f
		return f
	}
	for p := range imports {
		if f := floor(p, nil); f > maxFloor {
			t.Errorf("%s is on floor %d, over %d: %v", p, f, maxFloor, imports[p])
		}
		for _, bad := range forbidden[p] {
			if slices.Contains(imports[p], bad) {
				t.Errorf("%s imports %s", p, bad)
			}
		}
	}
	if len(floors) < 20 {
		t.Errorf("%d packages listed: go list did not see the module", len(floors))
	}
}

// sources calls f with every file under the module whose name ends in
// ext, its path relative to the module.
func sources(t *testing.T, ext string, f func(path string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ext) {
			rel, _ := filepath.Rel(root, p)
			f(rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// complexity is gocyclo's count: one, plus one per if, for, range, case
// (not default), select case, && and ||.
func complexity(fn ast.Node) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// TestFunctionComplexity: no function outside tests is over
// maxComplexity; past it, a function wants splitting by what it decides.
func TestFunctionComplexity(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	sources(t, ".go", func(path string) {
		if strings.HasSuffix(path, "_test.go") {
			return
		}
		file, err := parser.ParseFile(fset, filepath.Join(root, path), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n++
			if c := complexity(fn); c > maxComplexity {
				t.Errorf("%s: %s: cyclomatic complexity %d, over %d", fset.Position(fn.Pos()), fn.Name.Name, c, maxComplexity)
			}
		}
	})
	if n < 500 {
		t.Errorf("%d functions read: the walk missed the code", n)
	}
}

// lines counts a file's lines.
func lines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// TestFileLength: no Go or Lua file, tests included, is over
// maxFileLines.
func TestFileLength(t *testing.T) {
	// Each kind read, or the rule would pass on nothing: the project has
	// hundreds of Go files and the scripts' several Lua ones.
	least := map[string]int{".go": 100, ".lua": 5}
	for _, ext := range []string{".go", ".lua"} {
		read := 0
		sources(t, ext, func(path string) {
			read++
			if n := lines(t, path); n > maxFileLines {
				t.Errorf("%s: %d lines, over %d", path, n, maxFileLines)
			}
		})
		if read < least[ext] {
			t.Errorf("%d %s files read, want at least %d: the rule checked nothing", read, ext, least[ext])
		}
	}
}

// luaFunction opens a script's top-level function; its end is the first
// "end" at the line's start after it.
var luaFunction = regexp.MustCompile(`^local function (\w+)`)

// TestLuaFunctionLength: no function of the scripts is over
// maxLuaFunctionLines.
func TestLuaFunctionLength(t *testing.T) {
	n := 0
	sources(t, ".lua", func(path string) {
		f, err := os.Open(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		name, start, line := "", 0, 0
		for sc.Scan() {
			line++
			if m := luaFunction.FindStringSubmatch(sc.Text()); m != nil && !strings.HasSuffix(sc.Text(), " end") {
				name, start = m[1], line
				n++
			} else if name != "" && sc.Text() == "end" {
				if l := line - start + 1; l > maxLuaFunctionLines {
					t.Errorf("%s:%d: %s: %d lines, over %d", path, start, name, l, maxLuaFunctionLines)
				}
				name = ""
			}
		}
		if name != "" {
			t.Errorf("%s:%d: %s has no end", path, start, name)
		}
	})
	if n < 20 {
		t.Errorf("%d script functions read: the walk missed the scripts", n)
	}
}

// TestComplexityCounts: the count is gocyclo's on a function of each
// kind of branch.
func TestComplexityCounts(t *testing.T) {
	src := `package p
func f(a, b bool, xs []int, ch chan int) {
	if a && b || a {}
	for range xs {}
	for i := 0; i < 1; i++ {}
	switch { case a: ; case b: ; default: }
	select { case <-ch: ; default: }
}`
	file, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c := complexity(file.Decls[0]); c != 9 {
		t.Errorf("complexity %d, want 9 (1, if, &&, ||, range, for, 2 cases, 1 select case)", c)
	}
}

// TestManualsUndated: the manuals of docs/ say what is true now: no
// commit hash in them, and a date only where a figure says when it was
// measured ("measured on <date>"); history lives in the commit log.
func TestManualsUndated(t *testing.T) {
	date := regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	measured := regexp.MustCompile(`measured on 20\d\d-\d\d-\d\d\b`)
	hash := regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	for _, doc := range []string{"docs/BENCHMARKS.md", "docs/TESTING.md", "docs/token-budgets.md", "docs/configuration.md", "docs/operations.md", "README.md"} {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if n := len(date.FindAllString(line, -1)); n > len(measured.FindAllString(line, -1)) {
				t.Errorf("%s:%d: a date that is not a measurement's: %s", doc, i+1, line)
			}
			for _, h := range hash.FindAllString(line, -1) {
				if strings.ContainsAny(h, "abcdef") && strings.ContainsAny(h, "0123456789") {
					t.Errorf("%s:%d: %s looks like a commit: %s", doc, i+1, h, line)
				}
			}
		}
	}
}

// TestManualLengths: the manuals that grew into notebooks once stay
// manuals: docs/BENCHMARKS.md at most 3,500 words, docs/TESTING.md at
// most 2,000.
func TestManualLengths(t *testing.T) {
	for doc, most := range map[string]int{"docs/BENCHMARKS.md": 3500, "docs/TESTING.md": 2000} {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(string(data))); n > most {
			t.Errorf("%s: %d words, over %d: what was tried goes in commit messages", doc, n, most)
		}
	}
}
