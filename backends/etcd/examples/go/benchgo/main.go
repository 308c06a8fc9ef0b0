// benchgo is the Go side of bench_etcd's comparison with etcd's Go
// `concurrency` package: N contenders in this one process, each with its own
// client (connection) and session, take and release one `concurrency.Mutex`
// with zero hold time.
//
// usage:
//
//	benchgo ENDPOINTS NAME N WARMUP_SECONDS WINDOW_SECONDS
//
// It prints "ready" once every contender has its session, "measuring" when
// the warm-up is over and the window starts (so that the caller can read the
// server's counters at the same moment), and when the window ends one line:
//
//	grants G seconds S cpu_ms C
//
// G is the grants made during the window, S its length, C this process's
// CPU time (user + system) spent during it.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchgo:", err)
	os.Exit(1)
}

func cpu() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		fail(err)
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

func seconds(arg string) time.Duration {
	f, err := strconv.ParseFloat(arg, 64)
	if err != nil {
		fail(err)
	}
	return time.Duration(f * float64(time.Second))
}

func main() {
	if len(os.Args) != 6 {
		fail(fmt.Errorf("usage: benchgo ENDPOINTS NAME N WARMUP_SECONDS WINDOW_SECONDS"))
	}
	endpoints, name := strings.Split(os.Args[1], ","), os.Args[2]
	n, err := strconv.Atoi(os.Args[3])
	if err != nil || n < 1 {
		fail(fmt.Errorf("bad N %q", os.Args[3]))
	}
	warmup, window := seconds(os.Args[4]), seconds(os.Args[5])

	mutexes := make([]*concurrency.Mutex, n)
	for i := range mutexes {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second})
		if err != nil {
			fail(err)
		}
		defer c.Close()
		s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
		if err != nil {
			fail(err)
		}
		defer s.Close()
		mutexes[i] = concurrency.NewMutex(s, name)
	}
	fmt.Println("ready")

	var grants int64
	var stop int32
	var wg sync.WaitGroup
	for _, m := range mutexes {
		wg.Add(1)
		go func(m *concurrency.Mutex) {
			defer wg.Done()
			ctx := context.Background()
			for atomic.LoadInt32(&stop) == 0 {
				if err := m.Lock(ctx); err != nil {
					fail(err)
				}
				atomic.AddInt64(&grants, 1)
				if err := m.Unlock(ctx); err != nil {
					fail(err)
				}
			}
		}(m)
	}
	time.Sleep(warmup)
	startGrants, startCPU, started := atomic.LoadInt64(&grants), cpu(), time.Now()
	fmt.Println("measuring")
	time.Sleep(window)
	endGrants, endCPU, elapsed := atomic.LoadInt64(&grants), cpu(), time.Since(started)
	atomic.StoreInt32(&stop, 1)
	wg.Wait()
	fmt.Printf("grants %d seconds %.3f cpu_ms %.1f\n", endGrants-startGrants, elapsed.Seconds(),
		float64(endCPU-startCPU)/float64(time.Millisecond))
}
