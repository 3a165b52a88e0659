-- What scripts/services gives the test users beyond the database, for the mariadb service of
-- docker-compose.yml (mounted into /docker-entrypoint-initdb.d: the image runs it as root once,
-- on a fresh data directory, after it made dlock_test and 'dlock'@'%' with ALL on it).
-- Clients reach the container through Docker's port forwarding, from the network's gateway
-- rather than from 127.0.0.1: the accounts are for any host ('%').

-- PROCESS: the tests read other sessions in information_schema.PROCESSLIST.
GRANT PROCESS ON *.* TO 'dlock'@'%';
-- CONNECTION ADMIN (MariaDB >= 10.5): KILL of other users' sessions.
GRANT CONNECTION ADMIN ON *.* TO 'dlock'@'%';

-- DLOCK_MYSQL_TIMED_URL: a user whose statements the server ends after 1 s (a per-user
-- MAX_STATEMENT_TIME, as managed services set one).
CREATE USER IF NOT EXISTS 'dlock_timed'@'%' IDENTIFIED BY 'dlock' WITH MAX_STATEMENT_TIME 1;
GRANT ALL PRIVILEGES ON `dlock_test`.* TO 'dlock_timed'@'%';
