package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// PatroniMember is one Patroni process and the PostgreSQL server it runs.
type PatroniMember struct {
	Name    string
	dir     string // config, Patroni's log, the server's Unix socket
	dataDir string
	pgPort  int
	apiPort int
	cmd     *exec.Cmd
	exited  chan struct{}
}

// startMember writes a member's configuration and starts its Patroni.
func (p *Patroni) startMember(bin, name, binDir string) (*PatroniMember, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	m := &PatroniMember{Name: name, dir: filepath.Join(p.dir, name), pgPort: ports[0], apiPort: ports[1], exited: make(chan struct{})}
	m.dataDir = filepath.Join(m.dir, "data")
	if err := p.mkdir(m.dir); err != nil {
		return nil, err
	}
	config := fmt.Sprintf(`scope: pgtest
namespace: /pgtest/
name: %[1]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[2]d
  connect_address: 127.0.0.1:%[2]d
etcd3:
  host: 127.0.0.1:%[3]d
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    primary_start_timeout: 0
    synchronous_mode: %[4]v
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 300
        max_wal_senders: 10
        max_replication_slots: 10
        wal_level: logical
        wal_log_hints: "on"
        fsync: "off"
        shared_buffers: 64MB
  initdb:
    - encoding: UTF8
    - locale: C
postgresql:
  listen: 127.0.0.1:%[5]d
  connect_address: 127.0.0.1:%[5]d
  data_dir: %[6]s
  bin_dir: %[7]s
  pgpass: %[8]s
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '%[9]s'
watchdog:
  mode: "off"
`, name, m.apiPort, p.etcd.clientPort, p.sync, m.pgPort, m.dataDir, binDir, filepath.Join(m.dir, "pgpass"), m.dir)
	configFile := filepath.Join(m.dir, "patroni.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(m.dir, "patroni.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if p.cred != nil {
		for _, f := range []string{configFile, logFile.Name()} {
			if err := os.Chown(f, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	cmd := exec.Command(interpreter(bin), "-c", reaper, p.pgCtl, m.dataDir, bin, configFile)
	cmd.Dir = m.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	m.cmd = cmd
	go func() { _ = cmd.Wait(); close(m.exited) }()
	return m, nil
}

// reaper is a Python program that runs Patroni as its child and reaps
// every orphaned descendant (it is their subreaper): Patroni starts the
// postmaster detached (setsid, its parent exits), and in a container whose
// init never reaps, a killed postmaster would stay a zombie that Patroni
// believes alive, and never fail over. It exits with its child. When the
// process that started it dies without stopping it (a test binary past
// its -timeout), it kills Patroni and stops the server at once, so that
// neither outlives the test. Its arguments: pg_ctl, the data directory,
// then Patroni's command line.
const reaper = `import ctypes, os, signal, subprocess, sys
libc = ctypes.CDLL(None)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
pg_ctl, data = sys.argv[1], sys.argv[2]
child = os.fork()
if child == 0:
    os.execv(sys.argv[3], sys.argv[3:])
def orphaned(signum, frame):
    os.kill(child, signal.SIGKILL)
    subprocess.run([pg_ctl, '-D', data, '-m', 'immediate', 'stop'], capture_output=True)
    os._exit(1)
signal.signal(signal.SIGTERM, orphaned)
libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
while True:
    pid, status = os.wait()
    if pid == child:
        sys.exit(os.waitstatus_to_exitcode(status))
`

// interpreter returns the interpreter of the script at path, from its #!
// line, or python3.
func interpreter(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || !strings.HasPrefix(string(b), "#!") {
		return "python3"
	}
	line, _, _ := strings.Cut(string(b[2:]), "\n")
	if f := strings.Fields(line); len(f) == 1 {
		return f[0]
	}
	return "python3"
}

// URL returns the connection URL of the "postgres" database on the
// member's server, as the superuser "postgres".
func (m *PatroniMember) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(m.pgPort) + "/postgres?sslmode=disable"
}

// Log returns the last n lines of the member's Patroni log, for a
// failure's message.
func (m *PatroniMember) Log(n int) string { return logTail(filepath.Join(m.dir, "patroni.log"), n) }
