//! The conformance suite: every test here runs against a real MySQL-protocol server from
//! `testdb` (one server per test binary, fresh databases and accounts per test).

mod at_rest;
mod cleanup;
mod cli;
mod commit_lost;
mod commit_proxy;
mod demo;
mod deploy;
mod failover;
mod faults;
mod galera;
mod group;
mod inspect;
mod kit;
mod metrics;
mod migrate;
mod nemesis;
mod outage;
mod platform;
mod prune;
mod recovery;
mod release;
mod schema;
mod storage;
mod surface;
mod tls;
mod upgrade;
