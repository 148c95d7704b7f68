package brokertest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Flood is a client without the token that keeps every place a broker
// has before CONNECT taken: n connections, each reopened as soon as the
// server closes it, in the three shapes a token-less peer can give one
// (silent, half a line, a command other than CONNECT).
type Flood struct {
	// Reopened counts the connections the server closed under it.
	Reopened atomic.Int64
	stop     func()
}

// StartFlood starts a Flood of n connections on addr ("host:port"); it
// ends with the test, or at Stop.
func StartFlood(t *testing.T, addr string, n int) *Flood {
	t.Helper()
	f := &Flood{}
	done := make(chan struct{})
	var mu sync.Mutex
	open := make(map[net.Conn]struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					select {
					case <-done:
						return
					case <-time.After(time.Millisecond): // the listener is gone or the host is out of ports
						continue
					}
				}
				mu.Lock()
				select {
				case <-done:
					mu.Unlock()
					nc.Close()
					return
				default:
				}
				open[nc] = struct{}{}
				mu.Unlock()
				switch i % 3 {
				case 0: // silent
				case 1:
					io.WriteString(nc, `{"cmd":"CONN`)
				case 2:
					io.WriteString(nc, `{"cmd":"RECEIVE","timeout_ms":0}`+"\n")
				}
				io.Copy(io.Discard, nc) // until the server closes it (or Stop does)
				mu.Lock()
				delete(open, nc)
				mu.Unlock()
				nc.Close()
				f.Reopened.Add(1)
			}
		}()
	}
	f.stop = sync.OnceFunc(func() {
		mu.Lock()
		close(done)
		for nc := range open {
			nc.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	t.Cleanup(f.stop)
	return f
}

// Stop ends the flood and waits for its goroutines.
func (f *Flood) Stop() { f.stop() }

// Login is one real login on addr: a new connection, the CONNECT with
// token, its answer; one attempt, no retry. The machine may be loaded (by
// a flood): it waits up to a minute.
func Login(addr, token, id string) error {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return fmt.Errorf("login %s: dial: %w", id, err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(nc, `{"cmd":"CONNECT","client_id":%q,"subscriptions":["t/>"],"token":%q}`+"\n", id, token); err != nil {
		return fmt.Errorf("login %s: send CONNECT: %w", id, err)
	}
	line, err := bufio.NewReader(nc).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("login %s: no answer to CONNECT (%q): %w", id, line, err)
	}
	var r map[string]any
	if err := json.Unmarshal(line, &r); err != nil || r["status"] != "OK" || r["client_id"] != id {
		return fmt.Errorf("login %s: CONNECT answered %s", id, line)
	}
	return nil
}
