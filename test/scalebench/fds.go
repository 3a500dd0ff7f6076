package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// fdCensus is this process's open files by kind, read from /proc: the sockets sorted
// by their ends (a node's peer server or client, the registry link), listeners, files
// and the rest (the simulated runtimes reach their mirrors in memory: pipe.go).
type fdCensus map[string]int

func (c fdCensus) total() int {
	t := 0
	for _, n := range c {
		t += n
	}
	return t
}

func (c fdCensus) String() string {
	var kinds []string
	for k := range c {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int { return c[b] - c[a] })
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
	}
	return fmt.Sprintf("%d (%s)", c.total(), strings.Join(parts, ", "))
}

// fdPorts name the ports a socket's ends are sorted by.
type fdPorts struct {
	Peer     int // every node's peer port
	Link     int // the shared registry link
	Registry int // the registry behind it
}

// census reads /proc/self/fd and /proc/self/net/tcp.
func census(p fdPorts) fdCensus {
	socks := tcpSockets()
	c := fdCensus{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return c
	}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(target, "socket:["):
			s, ok := socks[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")]
			switch {
			case !ok:
				c["other sockets"]++
			case s.listen:
				c["listeners"]++
			case s.local == p.Peer:
				c["peer server ends"]++
			case s.remote == p.Peer:
				c["peer client ends"]++
			case s.remote == p.Link || s.local == p.Link:
				c["registry link (node and link ends)"]++
			case s.remote == p.Registry || s.local == p.Registry:
				c["link to registry"]++
			default:
				c["other TCP"]++
			}
		case strings.HasPrefix(target, "/"):
			c["files"]++
		default:
			c["pipes, epoll and others"]++
		}
	}
	return c
}

type tcpSocket struct {
	local, remote int
	listen        bool
}

// tcpSockets are this process's network namespace's TCP sockets by inode.
func tcpSockets() map[string]tcpSocket {
	out := map[string]tcpSocket{}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		sc.Scan() // the header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 {
				continue
			}
			out[fs[9]] = tcpSocket{local: hexPort(fs[1]), remote: hexPort(fs[2]), listen: fs[3] == "0A"}
		}
		file.Close()
	}
	return out
}

func hexPort(addr string) int {
	_, port, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseInt(port, 16, 32)
	return int(n)
}

// fdPeak samples this process's count of open files every interval until stop, and
// takes the census (which reads every TCP socket of the machine's namespace: at 500
// nodes, an eighth of the workers' CPU when taken at every sample) only when the
// count is 5 % above the last census's: the census kept is within 5 % of the peak.
// Only its goroutine writes peak; end reads it once that goroutine is done.
type fdPeak struct {
	peak fdCensus
	stop chan struct{}
	done chan struct{}
}

func watchFDs(p fdPorts, interval time.Duration) *fdPeak {
	w := &fdPeak{peak: fdCensus{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if n := openFiles(); n > w.peak.total()*105/100 {
				if c := census(p); c.total() > w.peak.total() {
					w.peak = c
				}
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// openFiles counts this process's open files (names only: no link is read).
func openFiles() int {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	return len(names)
}

// end stops the sampling and returns the largest census.
func (w *fdPeak) end() fdCensus {
	close(w.stop)
	<-w.done
	return w.peak
}
