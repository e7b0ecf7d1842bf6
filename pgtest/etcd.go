package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrNoPatroni is returned (wrapped) by StartPatroni when the patroni or
// the etcd binary is missing, so that a caller can tell it from a failure;
// it says how to install them.
var ErrNoPatroni = errors.New("patroni and etcd not found in PATH: " +
	"install them with `apt-get install -y patroni etcd-server` (.ci/run does)")

// etcd is a throwaway single-member etcd, Patroni's store.
type etcd struct {
	cmd        *exec.Cmd
	exited     chan struct{}
	clientPort int
}

// startEtcd starts etcd in dir/etcd on free ports of 127.0.0.1, as the
// user cred (nil: this process's), and returns once it is healthy.
func startEtcd(ctx context.Context, bin, dir string, cred *syscall.Credential) (*etcd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	client, peer := "http://127.0.0.1:"+strconv.Itoa(ports[0]), "http://127.0.0.1:"+strconv.Itoa(ports[1])
	logFile, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "--name", "pgtest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "pgtest="+peer, "--logger", "zap", "--log-level", "warn")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Killed with the process that started it, should that die without
	// stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	e := &etcd{cmd: cmd, exited: make(chan struct{}), clientPort: ports[0]}
	go func() { _ = cmd.Wait(); close(e.exited) }()
	err = poll(ctx, "etcd to be healthy", func() (bool, error) {
		select {
		case <-e.exited:
			return false, fmt.Errorf("etcd exited: %v\n%s", cmd.ProcessState, logTail(filepath.Join(dir, "etcd.log"), 20))
		default:
		}
		code, err := httpGet(ctx, client+"/health")
		return code == http.StatusOK, err
	})
	if err != nil {
		e.stop()
		return nil, err
	}
	return e, nil
}

// stop kills etcd and waits for it to exit.
func (e *etcd) stop() {
	_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
	<-e.exited
}

// httpGet returns the status code of a GET of url, with a short timeout.
func httpGet(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// freePorts returns n TCP ports of 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// serverUser returns the credentials to run the servers with: the
// "postgres" user when this process is root (PostgreSQL refuses to run as
// root), nil otherwise.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL needs a non-root user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
