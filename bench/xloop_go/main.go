// main.go - Go's side of the cross-loop call benchmark (bench/run-xloop.sh):
// a goroutine asks another for a no-op and waits for the answer on a reply
// channel, with GOMAXPROCS=2 (set by the script; 2 if unset).  Prints the
// contract's BENCH lines (bench/README.md), system=go, with the workload
// names of ferry-bench's cross-loop calls:
//
//	xloop_call             a new goroutine per call answers on the reply
//	                       channel (ferry's task flavour), n = 200,000 in a row
//	xloop_call_cb          a server goroutine answers each request
//	                       (ferry's callback flavour), n = 200,000 in a row
//	xloop_call_batch       64 goroutines calling the server at once, n = 1,000,000
//	xloop_call_batch_task  64 goroutines each starting a goroutine per call,
//	                       n = 1,000,000
package main

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

type request struct {
	reply chan int
}

func server(in chan request) {
	for r := range in {
		r.reply <- 0
	}
}

func rssKB() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss
}

func report(name string, n int, d time.Duration, ok bool) {
	secs := d.Seconds()
	check := "ok"
	if !ok {
		check = "FAIL"
	}
	fmt.Printf("BENCH workload=%s system=go n=%d seconds=%.6f ns_per_op=%.2f ops_per_s=%.0f rss_kb=%d check=%s\n",
		name, n, secs, secs*1e9/float64(n), float64(n)/secs, rssKB(), check)
}

// One caller: n calls in a row, through the server or a goroutine each.
func calls(in chan request, n int, spawn bool) int {
	reply := make(chan int)
	ok := 0
	for i := 0; i < n; i++ {
		if spawn {
			go func() { reply <- 0 }()
		} else {
			in <- request{reply}
		}
		if <-reply == 0 {
			ok++
		}
	}
	return ok
}

func seq(in chan request, name string, spawn bool) {
	const n = 200000
	calls(in, 1000, spawn)
	t0 := time.Now()
	ok := calls(in, n, spawn)
	report(name, n, time.Since(t0), ok == n)
}

func batch(in chan request, name string, spawn bool) {
	const tasks, per = 64, 1000000 / 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	good := 0
	calls(in, 1000, spawn)
	t0 := time.Now()
	for i := 0; i < tasks; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if calls(in, per, spawn) == per {
				mu.Lock()
				good++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	report(name, tasks*per, time.Since(t0), good == tasks)
}

func main() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2)
	}
	in := make(chan request)
	go server(in)
	want := map[string]bool{}
	for _, a := range os.Args[1:] {
		want[a] = true
	}
	run := func(name string) bool { return len(want) == 0 || want[name] }
	if run("xloop_call") {
		seq(in, "xloop_call", true)
	}
	if run("xloop_call_cb") {
		seq(in, "xloop_call_cb", false)
	}
	if run("xloop_call_batch") {
		batch(in, "xloop_call_batch", false)
	}
	if run("xloop_call_batch_task") {
		batch(in, "xloop_call_batch_task", true)
	}
}
