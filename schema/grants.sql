-- Grants a DBA runs for the receiver (MySQL 8.4 and MariaDB 10.11 alike).
--
-- Names used below; replace them with your own before running:
--   orbit_receiver     the receiver's own, dedicated, empty database
--   receiver_init      the schema's owner: `receiver init` (once, to create the tables) and
--                      `receiver migrate` (at each upgrade) connect as it
--   receiver_runtime   the account `receiver demo` / `receiver consume` connect as
--   receiver_prune     the account `receiver prune` connects as (a nightly timer)
--   'localhost'        the host part of the accounts
-- Create the accounts first, with passwords from your secret store, e.g.
--   CREATE USER 'receiver_init'@'localhost' IDENTIFIED BY '...';
--
-- The harness (test-lib/testdb) runs this same file with its own generated names,
-- so the tests prove these grants are enough and no more than enough.

-- Step 1, before `receiver init`: the init account may create tables in the receiver
-- database and add to them (ALTER and INDEX, for `receiver migrate`'s steps), and read and
-- write the schema's ledger and lock (schema/migrations.sql; a grant on a table that does not
-- exist yet is accepted when it includes CREATE). It never needs DROP or DELETE, and it
-- cannot read or write the inbox or the views.
-- MySQL (not MariaDB) also asks for INSERT on a table that ALTER TABLE changes: there, add
--   GRANT INSERT ON `orbit_receiver`.`receiver_inbox` TO 'receiver_init'@'localhost';
-- before a `receiver migrate` that alters it.
GRANT CREATE, ALTER, INDEX ON `orbit_receiver`.* TO 'receiver_init'@'localhost';
GRANT CREATE, SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_schema_versions` TO 'receiver_init'@'localhost';
GRANT CREATE, SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_schema_lock` TO 'receiver_init'@'localhost';

-- Step 2, after `receiver init` (MySQL refuses table grants on tables that do
-- not exist yet): the runtime account reads and writes the two tables only.
-- No DELETE: applies never delete; pruning is another account's (step 3).
-- No access to the platform's database.
GRANT SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_inbox` TO 'receiver_runtime'@'localhost';
GRANT SELECT, INSERT, UPDATE ON `orbit_receiver`.`receiver_task_views` TO 'receiver_runtime'@'localhost';
-- Every program reads the schema's version at start, and refuses one newer than it knows.
GRANT SELECT ON `orbit_receiver`.`receiver_schema_versions` TO 'receiver_runtime'@'localhost';
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
GRANT SELECT ON `orbit_receiver`.`receiver_schema_versions` TO 'receiver_prune'@'localhost';
