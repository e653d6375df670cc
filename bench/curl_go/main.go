// main.go - Go's side of the HTTP GET benchmark (bench/run-curl.sh): N
// requests over C goroutines with net/http's client (keep-alive, as many
// idle connections per host as goroutines), against the same local server
// as ferry-curl-bench.  Prints the same line as ferry-curl-bench, system go.
//
//	curl_go URL [requests [concurrency]]
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: curl_go URL [requests [concurrency]]")
		os.Exit(2)
	}
	url := os.Args[1]
	total, conc := 10000, 100
	if len(os.Args) > 2 {
		total, _ = strconv.Atoi(os.Args[2])
	}
	if len(os.Args) > 3 {
		conc, _ = strconv.Atoi(os.Args[3])
	}
	tr := &http.Transport{MaxIdleConns: conc, MaxIdleConnsPerHost: conc}
	client := &http.Client{Transport: tr}
	lat := make([]time.Duration, total)
	var next, errors int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := atomic.AddInt64(&next, 1) - 1
				if i >= int64(total) {
					return
				}
				s := time.Now()
				resp, err := client.Get(url)
				if err != nil {
					atomic.AddInt64(&errors, 1)
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						atomic.AddInt64(&errors, 1)
					}
				}
				lat[i] = time.Since(s)
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	fmt.Printf("go requests=%d concurrency=%d seconds=%.3f rps=%.0f p50_us=%.0f p99_us=%.0f errors=%d\n",
		total, conc, el, float64(total)/el,
		float64(lat[total/2].Microseconds()), float64(lat[total*99/100].Microseconds()), errors)
}
