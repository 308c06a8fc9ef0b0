"""A writer that commits only while a lockline lock is held, through the
database's fence, with psycopg2 (PostgreSQL) or PyMySQL (MariaDB/MySQL):
Debian's python3-psycopg2 and python3-pymysql.

usage: python3 fence_writer.py URL KEY TOKEN

Begins a transaction, inserts TOKEN into fenced_writes (token), prints
`ready`, waits for the line `commit` on standard input, then calls the fence
with KEY and commits. Prints `committed`, or `refused CODE MESSAGE` (CODE:
psycopg2's SQLSTATE, PyMySQL's error number, as each driver reports it)
followed, after a COMMIT sent anyway (as a careless client would), by
`committed anyway`.
"""

import sys
from urllib.parse import unquote, urlsplit


def connect(url):
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        import psycopg2

        return "postgres", psycopg2.connect(url), psycopg2.Error
    import pymysql

    conn = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
        autocommit=False,
    )
    return "mysql", conn, pymysql.MySQLError


def main():
    url, key, token = sys.argv[1], sys.argv[2], int(sys.argv[3])
    engine, conn, error = connect(url)
    cur = conn.cursor()
    cur.execute("INSERT INTO fenced_writes (token) VALUES (%s)", (token,))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "commit":
        sys.exit("standard input closed before `commit`")
    try:
        if engine == "postgres":
            cur.execute("SELECT lockline_fence(%s)", (key,))
        else:
            cur.execute("CALL lockline_fence(%s)", (key,))
        conn.commit()
        print("committed", flush=True)
    except error as e:
        code = e.pgcode if engine == "postgres" else e.args[0]
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"refused {code} {message}", flush=True)
        conn.commit()
        print("committed anyway", flush=True)


main()
