#!/usr/bin/env bash
# Makes sure Postgres answers on 127.0.0.1 for the tests, and an open NATS (with JetStream) for the
# benches that use one; starts them if not. The tests start their own NATS with ADC's authorization.
set -euo pipefail
cd "$(dirname "$0")/.."

up() { (echo > "/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1; }
wait_up() { for _ in $(seq 1 100); do up "$1" && return 0; sleep 0.2; done; echo "$2 did not come up on port $1" >&2; return 1; }

if ! up 4222; then
  bin=$(command -v nats-server || echo .venv/bin/nats-server)
  mkdir -p .adc/ci-nats
  echo "starting NATS ($bin) on 127.0.0.1:4222 with JetStream"
  nohup "$bin" -a 127.0.0.1 -p 4222 -js -sd "$PWD/.adc/ci-nats" > .adc/ci-nats.log 2>&1 &
  wait_up 4222 NATS
fi

if ! up 5432; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting the system's PostgreSQL cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  else
    initdb=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -n1)
    bindir=$(dirname "$initdb")
    data=$PWD/.adc/ci-pg
    run=(); [ "$(id -u)" = 0 ] && run=(runuser -u postgres --)
    if [ ! -f "$data/PG_VERSION" ]; then
      mkdir -p "$data"; [ "$(id -u)" = 0 ] && chown postgres "$data"
      "${run[@]}" "$bindir/initdb" -D "$data" -A trust -U postgres >/dev/null
    fi
    echo "starting PostgreSQL from $bindir in $data"
    "${run[@]}" "$bindir/pg_ctl" -D "$data" -l "$data/log" -w -o "-p 5432 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$data" start
  fi
  wait_up 5432 PostgreSQL
fi
# The tests create their own databases from this one.
psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE test"
echo "services: NATS 127.0.0.1:4222, PostgreSQL 127.0.0.1:5432"
