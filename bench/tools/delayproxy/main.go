// delayproxy: tests/cassandra_proxy.py's delay proxy in Go, for the
// benchmarks (bench/cassandra/loop_read.py --proxy native), where the
// Python one spends 1-1.7 cores at 16-core rates and so may be what
// bounds the rate it is meant to measure. The semantics are the Python
// proxy's: it listens on 127.0.0.1 (a free port, printed on stdout),
// forwards each connection to one loopback target, and delays every chunk
// read in each direction by DELAY_MS from the moment it was read (the
// added round trip is 2 x DELAY_MS: loop_read.py passes half its round
// trip); a side's end of stream is passed on (half-close) after the chunks
// before it; it runs until stdin closes.
//
//	go build -o DIR/delayproxy ./bench/tools/delayproxy   (CGO_ENABLED=0: static)
//	delayproxy TARGET_PORT DELAY_MS
//
// Per connection and direction, one goroutine reads and stamps each chunk
// with its due time, one sleeps until a chunk is due and writes it: no
// busy waits, and a slow writer never delays the stamping of what is read.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

type chunk struct {
	due  time.Time
	data []byte // nil: the source's end of stream
}

// queueLen bounds the chunks waiting in one direction. The Python proxy's
// queue is unbounded; at 1 MiB reads this is far more than a 25 ms delay
// holds at loopback rates, so the reader never waits on it in practice.
const queueLen = 1 << 16

func pump(src, dst *net.TCPConn, delay time.Duration) {
	q := make(chan chunk, queueLen)
	go func() {
		buf := make([]byte, 1<<20)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				data := make([]byte, n)
				copy(data, buf[:n])
				q <- chunk{time.Now().Add(delay), data}
			}
			if err != nil {
				q <- chunk{time.Now().Add(delay), nil}
				return
			}
		}
	}()
	go func() {
		broken := false
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if c.data == nil {
				_ = dst.CloseWrite() // the other side may be gone: nothing to tell
				return
			}
			if broken {
				continue // keep draining so that the reader never blocks on q
			}
			if _, err := dst.Write(c.data); err != nil {
				broken = true
			}
		}
	}()
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: delayproxy TARGET_PORT DELAY_MS (delay each way; forwards to 127.0.0.1)")
		os.Exit(2)
	}
	port, err := strconv.Atoi(os.Args[1])
	if err != nil || port <= 0 || port > 65535 {
		fmt.Fprintf(os.Stderr, "delayproxy: TARGET_PORT must be a port number, got %q\n", os.Args[1])
		os.Exit(2)
	}
	ms, err := strconv.ParseFloat(os.Args[2], 64)
	if err != nil || ms < 0 {
		fmt.Fprintf(os.Stderr, "delayproxy: DELAY_MS must be a number >= 0, got %q\n", os.Args[2])
		os.Exit(2)
	}
	delay := time.Duration(ms * float64(time.Millisecond))
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "delayproxy: listen on 127.0.0.1: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return // the listener closed
			}
			client := conn.(*net.TCPConn)
			s, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				// As the Python proxy: the client sees its connection close.
				fmt.Fprintf(os.Stderr, "delayproxy: connect to %s: %v\n", target, err)
				client.Close()
				continue
			}
			server := s.(*net.TCPConn)
			// Go sets TCP_NODELAY by default; said here as the Python proxy says it.
			_ = client.SetNoDelay(true)
			_ = server.SetNoDelay(true)
			pump(client, server, delay)
			pump(server, client, delay)
		}
	}()
	// Runs until stdin closes (the benchmark's handle on it), as the Python proxy.
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	ln.Close()
}
