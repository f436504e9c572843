// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package tokenstreamreceiver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
)

// dialAsEnv names the socket that the test binary, run again by dialAs as
// another user, connects to (TestUnixDialAsHelper); listenAsEnv the one it
// listens on, with socket_group listenAsGroup (TestUnixListenAsHelper).
const (
	dialAsEnv     = "TOKENSTREAM_TEST_DIAL_AS"
	listenAsEnv   = "TOKENSTREAM_TEST_LISTEN_AS"
	listenAsGroup = "4242"
)

// nobody is the user another local process runs as.
const nobody = 65534

// TestUnixDialAsHelper is dialAs's client, not a test of its own: it
// connects to the socket dialAsEnv names and prints how that went.
func TestUnixDialAsHelper(t *testing.T) {
	path := os.Getenv(dialAsEnv)
	if path == "" {
		t.Skip("dialAs's client: runs only as dialAs runs it")
	}
	c, err := net.Dial("unix", path) //nolint:gosec // G704: the socket of the test that runs this helper
	switch {
	case err == nil:
		_ = c.Close()
		fmt.Println("dial: connected")
	case errors.Is(err, syscall.EACCES):
		fmt.Println("dial: EACCES")
	default:
		fmt.Println("dial:", err)
	}
}

// TestUnixListenAsHelper is runAs's listener, not a test of its own: it
// listens on the socket listenAsEnv names as the Unix hook does, with
// socket_group listenAsGroup, and prints the error.
func TestUnixListenAsHelper(t *testing.T) {
	path := os.Getenv(listenAsEnv)
	if path == "" {
		t.Skip("runAs's listener: runs only as runAs runs it")
	}
	cfg := &UnixConfig{SocketMode: defaultUnixSocketMode, DirectoryMode: defaultUnixDirectoryMode, SocketGroup: listenAsGroup}
	perm, errs := cfg.permissions()
	require.Empty(t, errs)
	ln, err := listenUnix(path, perm)
	if err == nil {
		_ = ln.Close()
	}
	fmt.Println("listen:", err)
}

// dialAs connects to the socket at path from a process of user nobody with
// the supplementary groups given, and returns "connected", "EACCES" or the
// error. The process is this test binary run again (/proc/self/exe, which
// nobody may run though its directory is the go command's own).
func dialAs(t *testing.T, path string, groups ...uint32) string {
	t.Helper()
	return runAs(t, "TestUnixDialAsHelper", dialAsEnv+"="+path, "dial: ", groups...)
}

// runAs runs the helper test of this binary as user nobody with the
// supplementary groups given, and returns what it printed after prefix.
func runAs(t *testing.T, helper, env, prefix string, groups ...uint32) string {
	t.Helper()
	cmd := exec.Command("/proc/self/exe", "-test.run=^"+helper+"$", "-test.count=1") //nolint:gosec // G204: this test binary, one of its own tests
	cmd.Env = append(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: groups}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for line := range strings.Lines(string(out)) {
		if s, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(s)
		}
	}
	t.Fatalf("%s said nothing after %q:\n%s", helper, prefix, out)
	return ""
}

// sharedDir is a directory of the test's own that every user may search,
// as /run is: what keeps another user off the socket is then the socket's
// mode, or the directory the receiver makes.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tokenstream-unix-") //nolint:usetesting // t.TempDir's parent is 0700: user nobody could not reach the socket
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

func startUnixAt(t *testing.T, path string, mutate func(*UnixConfig)) {
	t.Helper()
	startReceiver(t, new(consumertest.LogsSink), func(c *Config) {
		c.Hooks.HTTP = configoptional.None[HTTPConfig]()
		c.Hooks.UDP = configoptional.None[UDPConfig]()
		u := c.Hooks.Unix.GetOrInsertDefault()
		u.Endpoint = path
		if mutate != nil {
			mutate(u)
		}
	})
}

func statOf(t *testing.T, path string) (fs.FileMode, uint32) {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid
}

// Another local user cannot connect to the hook: by default only the
// collector's user and group may (0660), the engines' group with
// socket_group, and a directory the receiver makes is its own and that
// group's (0750). So no other process on the node can inject sessions or
// hold the connection slots.
func TestUnixSocketPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a client as another user (uid 65534) and to give the socket a group")
	}
	const engines = 4242

	t.Run("default", func(t *testing.T) {
		// A directory that exists, searchable by all (a hostPath).
		dir := filepath.Join(sharedDir(t), "run")
		require.NoError(t, os.Mkdir(dir, 0o755))
		path := filepath.Join(dir, "hooks.sock")
		startUnixAt(t, path, nil)

		mode, gid := statOf(t, path)
		assert.Equal(t, fs.FileMode(0o660), mode)
		assert.Equal(t, uint32(os.Getegid()), gid, "the collector's own group")
		dirMode, _ := statOf(t, dir)
		assert.Equal(t, fs.FileMode(0o755), dirMode, "a directory that exists is left as it is")
		assert.Equal(t, "EACCES", dialAs(t, path), "another user")
		assert.Equal(t, "connected", dialAs(t, path, uint32(os.Getegid())), "a member of the socket's group")
	})

	t.Run("socket_group", func(t *testing.T) {
		// Made by the receiver, two levels of it.
		dir := filepath.Join(sharedDir(t), "otelcol-llm", "hooks")
		path := filepath.Join(dir, "hooks.sock")
		startUnixAt(t, path, func(u *UnixConfig) { u.SocketGroup = fmt.Sprint(engines) })

		mode, gid := statOf(t, path)
		assert.Equal(t, fs.FileMode(0o660), mode)
		assert.Equal(t, uint32(engines), gid)
		for _, d := range []string{dir, filepath.Dir(dir)} {
			mode, gid := statOf(t, d)
			assert.Equal(t, fs.FileMode(0o750), mode, d)
			assert.Equal(t, uint32(engines), gid, d)
		}
		assert.Equal(t, "connected", dialAs(t, path, engines), "an engine of the group")
		assert.Equal(t, "EACCES", dialAs(t, path), "another user")
	})

	t.Run("a group the collector is not in", func(t *testing.T) {
		// The collector as another user, not root: it may not give its
		// socket to a group it is not a member of, and says so.
		dir := sharedDir(t)
		require.NoError(t, os.Chown(dir, nobody, nobody))
		path := filepath.Join(dir, "hooks.sock")
		got := runAs(t, "TestUnixListenAsHelper", listenAsEnv+"="+path, "listen: ")
		assert.Equal(t, "setting its group (socket_group) to "+listenAsGroup+": lchown "+path+
			": operation not permitted: the collector must be a member of the group, or root", got)
		_, err := os.Stat(path)
		assert.ErrorIs(t, err, fs.ErrNotExist, "no socket left behind")
		got = runAs(t, "TestUnixListenAsHelper", listenAsEnv+"="+path, "listen: ", engines)
		assert.Equal(t, "<nil>", got, "a member of the group may")
	})

	t.Run("modes", func(t *testing.T) {
		dir := filepath.Join(sharedDir(t), "hooks")
		path := filepath.Join(dir, "hooks.sock")
		startUnixAt(t, path, func(u *UnixConfig) {
			u.SocketMode, u.DirectoryMode, u.SocketGroup = "0600", "0711", fmt.Sprint(engines)
		})
		mode, _ := statOf(t, path)
		assert.Equal(t, fs.FileMode(0o600), mode)
		dirMode, _ := statOf(t, dir)
		assert.Equal(t, fs.FileMode(0o711), dirMode)
		assert.Equal(t, "EACCES", dialAs(t, path, engines), "socket_mode 0600: the group may not either")
	})
}

// Linux gives a socket file the socket's own mode less the umask: set
// before bind (presetSocketMode), the file is never more open than
// socket_mode, not even before listenUnix's Chmod, whatever the umask.
func TestUnixSocketModeBeforeBind(t *testing.T) {
	path := socketPath(t)
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { presetSocketMode(fd, 0o600) })
	}}
	old := syscall.Umask(0)
	ln, err := lc.Listen(context.Background(), "unix", path)
	syscall.Umask(old)
	require.NoError(t, err)
	defer ln.Close()
	mode, _ := statOf(t, path)
	assert.Equal(t, fs.FileMode(0o600), mode)
}
