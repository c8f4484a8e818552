-- Grants a DBA runs for the receiver (MySQL 8.4 and MariaDB 10.11 alike).
--
-- Names used below; replace them with your own before running:
--   orbit_receiver     the receiver's own, dedicated, empty database
--   receiver_init      the account `receiver init` connects as (once, to create the tables)
--   receiver_runtime   the account `receiver demo` / `receiver consume` connect as
--   receiver_prune     the account `receiver prune` connects as (a nightly timer)
--   'localhost'        the host part of the accounts
-- Create the accounts first, with passwords from your secret store, e.g.
--   CREATE USER 'receiver_init'@'localhost' IDENTIFIED BY '...';
--
-- The harness (test-lib/testdb) runs this same file with its own generated names,
-- so the tests prove these grants are enough and no more than enough.

-- Step 1, before `receiver init`: the init account may create tables in the
-- receiver database, and nothing else. It never needs DROP, ALTER or DELETE.
GRANT CREATE ON `orbit_receiver`.* TO 'receiver_init'@'localhost';

-- Step 2, after `receiver init` (MySQL refuses table grants on tables that do
-- not exist yet): the runtime account reads and writes the two tables only.
-- No DELETE: applies never delete; pruning is another account's (step 3).
-- No access to the platform's database.
GRANT SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_inbox` TO 'receiver_runtime'@'localhost';
GRANT SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_task_views` TO 'receiver_runtime'@'localhost';
--
-- Nothing more for the health probe or for RECEIVER_REQUIRE_REPLICA_ACK=1: they read
-- @@global.read_only, SHOW GLOBAL STATUS (Rpl_semi_sync_master_status, MySQL's
-- Rpl_semi_sync_source_status) and SHOW GLOBAL VARIABLES (the semi-sync settings), which
-- every account may read on MySQL 8.4 and MariaDB 10.11 (the failover suite runs them as
-- this runtime account). The runtime account must NOT hold SUPER, READ_ONLY ADMIN or
-- CONNECTION ADMIN: with them it could write through read_only on a demoted primary.

-- Step 3, after `receiver init`: the prune account reads and deletes inbox rows, and
-- nothing else. No privilege on the views: they are the state and are never pruned.
-- `receiver prune` under another account fails with one line naming the grant it lacks.
GRANT SELECT, DELETE ON `orbit_receiver`.`receiver_inbox` TO 'receiver_prune'@'localhost';
