// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelcol-llm/otelcol-llm/internal/harness/testbin"
)

// TestImage builds deploy/Dockerfile with `make image` (buildah, Debian's)
// and runs what it built. On this machine podman builds it too, but its
// runtime cannot start containers (crun may not set RLIMIT_NPROC inside
// the sandbox), so the image runs with buildah's chroot isolation: its own
// root file system, the host's network.
func TestImage(t *testing.T) {
	buildah := testbin.Tool(t, "buildah", "buildah")
	root := testbin.ModuleRoot(t)
	testbin.Collector(t) // make image builds from ./bin/otelcol-llm
	const image = "localhost/otelcol-llm:check-deploy"
	build := exec.Command("make", "image", "CONTAINER_TOOL="+buildah, "IMAGE="+image) //nolint:gosec // G204: make image with the buildah found on PATH
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	t.Cleanup(func() { _ = exec.Command(buildah, "rmi", "-f", image).Run() })

	inspect := func(format string) string {
		out, err := exec.Command(buildah, "inspect", "--type", "image", "--format", format, image).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	assert.Equal(t, "10001:10001", inspect("{{.OCIv1.Config.User}}"), "a non-root user")
	assert.Equal(t, "[/otelcol-llm]", inspect("{{.OCIv1.Config.Entrypoint}}"))
	assert.Equal(t, "[--config /etc/otelcol-llm/config.yaml]", inspect("{{.OCIv1.Config.Cmd}}"))

	ctr, err := exec.Command(buildah, "from", image).Output()
	require.NoError(t, err)
	container := strings.TrimSpace(string(ctr))
	t.Cleanup(func() { _ = exec.Command(buildah, "rm", container).Run() })
	run := func(env, opts []string, args ...string) *exec.Cmd {
		cmdArgs := append([]string{"run", "--isolation", "chroot"}, opts...)
		for _, e := range env {
			cmdArgs = append(cmdArgs, "--env", e)
		}
		return exec.Command(buildah, append(append(cmdArgs, container, "--"), args...)...) //nolint:gosec // G204: buildah run in the test's own container
	}
	version, err := run(nil, nil, "/otelcol-llm", "--version").CombinedOutput()
	require.NoError(t, err, "%s", version)
	assert.Contains(t, string(version), "otelcol-llm version")
	mount, err := exec.Command(buildah, "mount", container).Output()
	require.NoError(t, err)
	rootfs := strings.TrimSpace(string(mount))
	t.Cleanup(func() { _ = exec.Command(buildah, "umount", container).Run() })
	for _, f := range []string{"/otelcol-llm", "/etc/ssl/certs/ca-certificates.crt", "/etc/otelcol-llm/config.yaml"} {
		assert.FileExists(t, filepath.Join(rootfs, f))
	}

	// With the DaemonSet's environment, a writable queue directory and a
	// writable directory for the hooks' socket (the DaemonSet's hostPaths),
	// the default config starts, and its health_check answers.
	const ip = "127.0.0.5"
	queue, sockets := t.TempDir(), t.TempDir()
	require.NoError(t, os.Chmod(queue, 0o777))
	require.NoError(t, os.Chmod(sockets, 0o777))
	env := agentEnv(ip, net.JoinHostPort(ip, freePort(t, ip)), "/var/lib/otelcol-llm/queue")
	agentCmd := run(env, []string{"--volume", queue + ":/var/lib/otelcol-llm/queue", "--volume", sockets + ":/run/otelcol-llm"},
		"/otelcol-llm", "--config", "/etc/otelcol-llm/config.yaml")
	logs := &testbin.SyncBuffer{}
	agentCmd.Stdout, agentCmd.Stderr = logs, logs
	require.NoError(t, agentCmd.Start())
	t.Cleanup(func() {
		_ = agentCmd.Process.Signal(syscall.SIGTERM)
		_ = agentCmd.Wait()
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + net.JoinHostPort(ip, "13133") + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "the image's collector never became healthy\n%s", logs)
}
