package prom

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// NewProcessCollector returns the Go and process metrics the worker
// exports, read when scraped (Linux /proc; one that cannot be read is
// left out), with client_golang's names and help texts:
// go_goroutines, process_cpu_seconds_total, process_open_fds,
// process_max_fds, process_virtual_memory_bytes,
// process_resident_memory_bytes and process_start_time_seconds.
func NewProcessCollector() Collector { return processCollector{} }

type processCollector struct{}

// userHZ is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every
// Linux architecture Go supports, as procfs assumes too).
const userHZ = 100

func (processCollector) collect(g *gathering) {
	gauge := func(name, help string, v float64) {
		g.family(name, help, "gauge", func(b *bytes.Buffer) { writeSample(b, name, "", "", "", v) })
	}
	gauge("go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	if st, ok := readStat(); ok {
		g.family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter", func(b *bytes.Buffer) {
			writeSample(b, "process_cpu_seconds_total", "", "", "", float64(st.utime+st.stime)/userHZ)
		})
		gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float64(st.vsize))
		gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float64(st.rss*uint64(os.Getpagesize())))
		if bt, err := bootTime(); err == nil {
			gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", float64(bt)+float64(st.starttime)/userHZ)
		}
	}
	if d, err := os.Open("/proc/self/fd"); err == nil {
		names, err := d.Readdirnames(-1)
		d.Close()
		if err == nil {
			gauge("process_open_fds", "Number of open file descriptors.", float64(len(names)))
		}
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		gauge("process_max_fds", "Maximum number of open file descriptors.", float64(lim.Cur))
	}
}

type procStat struct{ utime, stime, starttime, vsize, rss uint64 }

// readStat reads /proc/self/stat: the fields after the command's closing
// parenthesis start with field 3 (state).
func readStat() (procStat, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseStat(string(b))
}

func parseStat(s string) (procStat, bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	field := func(n int) (uint64, bool) {
		if n-3 >= len(f) {
			return 0, false
		}
		v, err := strconv.ParseUint(f[n-3], 10, 64)
		return v, err == nil
	}
	var st procStat
	var ok [5]bool
	st.utime, ok[0] = field(14)
	st.stime, ok[1] = field(15)
	st.starttime, ok[2] = field(22)
	st.vsize, ok[3] = field(23)
	st.rss, ok[4] = field(24)
	return st, ok == [5]bool{true, true, true, true, true}
}

// bootTime is /proc/stat's btime (seconds since the epoch), read once.
var bootTime = sync.OnceValues(func() (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, os.ErrNotExist
})
