// Package starve keeps a machine busy for a test, as other work on a
// shared CI machine or a throttled pod would (scripts/test.sh's STARVE
// does the same for a whole run).
package starve

import (
	"os/exec"
	"testing"
)

// Loops keeps n busy loops running in other processes until the test
// ends: the scheduler shares the cores between them and the test's own
// processes, and delays any of them at any moment.
func Loops(t testing.TB, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// A loop that already died is as good as one stopped now.
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
