// fencewriter writes a row in a transaction that commits only while a
// lockline lock is held, through the database's fence, with Go's
// database/sql and Debian's drivers: github.com/lib/pq (PostgreSQL,
// golang-github-lib-pq-dev) and github.com/go-sql-driver/mysql
// (MariaDB/MySQL, golang-github-go-sql-driver-mysql-dev).
//
// usage:
//
//	fencewriter now|wait URL KEY TOKEN
//
// URL is postgres://... (as lib/pq takes it) or mysql://USER:PASSWORD@HOST:PORT/DB.
// Begins a transaction and inserts TOKEN into fenced_writes (token). With
// `wait` it prints "ready" and waits for the line "commit" on standard input;
// with `now` it goes on at once. Then it calls the fence with KEY and commits.
// Prints "committed", or "refused CODE MESSAGE" (CODE: lib/pq's SQLSTATE, or
// go-sql-driver/mysql's error number, which is all it reports) followed, after
// a COMMIT sent anyway (as a careless client would), by "committed anyway" or
// "commit anyway failed: ERROR".
package main

import (
	"bufio"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/lib/pq"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fencewriter:", err)
	os.Exit(1)
}

// statements are the writer's two, in its engine's dialect.
type statements struct{ insert, fence string }

// open answers the database and its engine's statements.
func open(raw string) (*sql.DB, statements, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, statements{}, err
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		db, err := sql.Open("postgres", raw)
		return db, statements{"INSERT INTO fenced_writes (token) VALUES ($1)", "SELECT lockline_fence($1)"}, err
	case "mysql", "mariadb":
		cfg := mysql.NewConfig()
		cfg.Net, cfg.Addr = "tcp", u.Host
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		connector, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, statements{}, err
		}
		return sql.OpenDB(connector), statements{"INSERT INTO fenced_writes (token) VALUES (?)", "CALL lockline_fence(?)"}, nil
	}
	return nil, statements{}, fmt.Errorf("unsupported URL scheme %q", u.Scheme)
}

// refusal answers the code and message of a refused fence: the SQLSTATE
// from lib/pq, the error number from go-sql-driver/mysql.
func refusal(err error) (string, string, bool) {
	var pgErr *pq.Error
	if errors.As(err, &pgErr) {
		return string(pgErr.Code), pgErr.Message, true
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return strconv.Itoa(int(myErr.Number)), myErr.Message, true
	}
	return "", "", false
}

func main() {
	if len(os.Args) != 5 || (os.Args[1] != "now" && os.Args[1] != "wait") {
		fail(fmt.Errorf("usage: fencewriter now|wait URL KEY TOKEN"))
	}
	mode, key := os.Args[1], os.Args[3]
	token, err := strconv.ParseInt(os.Args[4], 10, 64)
	if err != nil {
		fail(err)
	}
	db, sqls, err := open(os.Args[2])
	if err != nil {
		fail(err)
	}
	defer db.Close()

	tx, err := db.Begin()
	if err != nil {
		fail(err)
	}
	if _, err := tx.Exec(sqls.insert, token); err != nil {
		fail(err)
	}
	if mode == "wait" {
		fmt.Println("ready")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(line) != "commit" {
			fail(errors.New("standard input closed before `commit`"))
		}
	}
	if _, err := tx.Exec(sqls.fence, key); err != nil {
		code, message, ok := refusal(err)
		if !ok {
			fail(err)
		}
		fmt.Printf("refused %s %s\n", code, message)
		if err := tx.Commit(); err != nil {
			fmt.Printf("commit anyway failed: %v\n", err)
		} else {
			fmt.Println("committed anyway")
		}
		return
	}
	if err := tx.Commit(); err != nil {
		fail(err)
	}
	fmt.Println("committed")
}
