// lockpeer is a real peer for lockline's interop tests: it takes a lock or
// campaigns with etcd's Go `concurrency` package and holds it until its
// standard input closes.
//
// usage:
//
//	lockpeer mutex ENDPOINTS NAME        prints "held KEY HEADER_REVISION CREATE_REVISION", then "released"
//	lockpeer elect ENDPOINTS NAME VALUE  prints "leader KEY HEADER_REVISION CREATE_REVISION", then "resigned"
//
// ENDPOINTS is comma-separated. With LOCKPEER_USER=USER:PASSWORD in the
// environment it authenticates as that user. HEADER_REVISION is what Go reports as
// m.Header().Revision (what `etcdctl lock` exports as ETCD_LOCK_REV);
// CREATE_REVISION is the create revision of the held key, read back with a Get.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lockpeer:", err)
	os.Exit(1)
}

func createRevision(c *clientv3.Client, key string) int64 {
	resp, err := c.Get(context.Background(), key)
	if err != nil {
		fail(err)
	}
	if len(resp.Kvs) == 0 {
		fail(fmt.Errorf("held key %q is gone", key))
	}
	return resp.Kvs[0].CreateRevision
}

func main() {
	if len(os.Args) < 4 {
		fail(fmt.Errorf("usage: lockpeer mutex|elect ENDPOINTS NAME [VALUE]"))
	}
	recipe, endpoints, name := os.Args[1], strings.Split(os.Args[2], ","), os.Args[3]
	config := clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second}
	if user, ok := os.LookupEnv("LOCKPEER_USER"); ok {
		name, password, _ := strings.Cut(user, ":")
		config.Username, config.Password = name, password
	}
	c, err := clientv3.New(config)
	if err != nil {
		fail(err)
	}
	defer c.Close()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	switch recipe {
	case "mutex":
		m := concurrency.NewMutex(s, name)
		if err := m.Lock(ctx); err != nil {
			fail(err)
		}
		fmt.Println("held", m.Key(), m.Header().Revision, createRevision(c, m.Key()))
		io.Copy(io.Discard, os.Stdin)
		if err := m.Unlock(ctx); err != nil {
			fail(err)
		}
		fmt.Println("released")
	case "elect":
		if len(os.Args) < 5 {
			fail(fmt.Errorf("usage: lockpeer elect ENDPOINTS NAME VALUE"))
		}
		e := concurrency.NewElection(s, name)
		if err := e.Campaign(ctx, os.Args[4]); err != nil {
			fail(err)
		}
		fmt.Println("leader", e.Key(), e.Header().Revision, createRevision(c, e.Key()))
		io.Copy(io.Discard, os.Stdin)
		if err := e.Resign(ctx); err != nil {
			fail(err)
		}
		fmt.Println("resigned")
	default:
		fail(fmt.Errorf("unknown recipe %q", recipe))
	}
	s.Close()
}
