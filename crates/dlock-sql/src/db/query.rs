//! Statements with bound arguments, run on a pool, a pooled connection or a bare
//! connection, and the rows and counts they answer, read by position.

use sqlx::{Database, Encode, Type};

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySql, MySqlConnection};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnection, Postgres};
#[cfg(feature = "_sqlite")]
use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::pool::{Conn, Pool};
use super::row::{Exec, Row};

/// Where a statement runs.
pub(crate) enum On<'c> {
    /// On a connection of the pool, for this statement only.
    Pool(&'c Pool),
    /// On a connection checked out of a [`Pool`].
    Conn(&'c mut Conn),
    /// On a bare connection (the application's transaction).
    Exec(Exec<'c>),
}

impl<'c> From<&'c Pool> for On<'c> {
    fn from(pool: &'c Pool) -> Self {
        On::Pool(pool)
    }
}

impl<'c> From<&'c mut Conn> for On<'c> {
    fn from(conn: &'c mut Conn) -> Self {
        On::Conn(conn)
    }
}

#[cfg(feature = "mysql")]
impl<'c> From<&'c mut MySqlConnection> for On<'c> {
    fn from(conn: &'c mut MySqlConnection) -> Self {
        On::Exec(Exec::MySql(conn))
    }
}

#[cfg(feature = "postgres")]
impl<'c> From<&'c mut PgConnection> for On<'c> {
    fn from(conn: &'c mut PgConnection) -> Self {
        On::Exec(Exec::Postgres(conn))
    }
}

#[cfg(feature = "_sqlite")]
impl<'c> From<&'c mut SqliteConnection> for On<'c> {
    fn from(conn: &'c mut SqliteConnection) -> Self {
        On::Exec(Exec::Sqlite(conn))
    }
}

/// A bound argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Int(i64),
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

/// What a statement that returns no rows did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    /// Rows changed.
    pub(crate) rows_affected: u64,
    /// MySQL's `LAST_INSERT_ID()` after the statement (`None` on SQLite, which answers with
    /// `RETURNING` instead).
    pub(crate) last_insert_id: Option<u64>,
}

/// A statement and its arguments.
#[must_use]
pub(crate) struct Query<'a> {
    sql: &'a str,
    args: Vec<Arg<'a>>,
    /// Whether the connection keeps the statement prepared for the next time (see
    /// [`Query::once`]).
    persistent: bool,
}

/// A statement with `?` placeholders, to [`bind`](Query::bind) and run.
pub(crate) fn query(sql: &str) -> Query<'_> {
    Query {
        sql,
        args: Vec::new(),
        persistent: true,
    }
}

/// The driver's typed query for `sql` with `args` bound.
fn typed<'q, DB>(
    sql: &'q str,
    args: &[Arg<'q>],
    persistent: bool,
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database + sqlx::database::HasStatementCache,
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    let mut q = sqlx::query::<DB>(sql).persistent(persistent);
    for arg in args {
        q = match *arg {
            Arg::Bytes(v) => q.bind(v),
            Arg::Text(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
        };
    }
    q
}

/// Runs the typed query of `$query` on the bare connection `$exec` with sqlx's method
/// `$method`, its answer mapped by the driver's own function.
macro_rules! on_driver {
    ($query:ident, $exec:expr, $method:ident, $mysql:expr, $sqlite:expr, $pg:expr) => {
        match $exec {
            #[cfg(not(any(feature = "mysql", feature = "_sqlite", feature = "postgres")))]
            Exec::Unused(_, never) => match never {},
            #[cfg(feature = "mysql")]
            Exec::MySql(c) => typed::<MySql>($query.sql, &$query.args, $query.persistent)
                .$method(c)
                .await
                .map($mysql),
            #[cfg(feature = "_sqlite")]
            Exec::Sqlite(c) => typed::<Sqlite>($query.sql, &$query.args, $query.persistent)
                .$method(c)
                .await
                .map($sqlite),
            #[cfg(feature = "postgres")]
            Exec::Postgres(c) => typed::<Postgres>($query.sql, &$query.args, $query.persistent)
                .$method(c)
                .await
                .map($pg),
        }
    };
}

/// What a statement answers: a count ([`Done`]), at most one row, or all its rows.
trait Answer: Sized {
    /// Runs `query` on the bare connection `exec` for this answer.
    async fn read(query: &Query<'_>, exec: Exec<'_>) -> Result<Self, sqlx::Error>;
}

impl Answer for Done {
    async fn read(query: &Query<'_>, exec: Exec<'_>) -> Result<Self, sqlx::Error> {
        on_driver!(query, exec, execute, mysql_done, sqlite_done, pg_done)
    }
}

impl Answer for Option<Row> {
    async fn read(query: &Query<'_>, exec: Exec<'_>) -> Result<Self, sqlx::Error> {
        on_driver!(
            query,
            exec,
            fetch_optional,
            |r| r.map(Row::MySql),
            |r| r.map(Row::Sqlite),
            |r| r.map(Row::Postgres)
        )
    }
}

impl Answer for Vec<Row> {
    async fn read(query: &Query<'_>, exec: Exec<'_>) -> Result<Self, sqlx::Error> {
        on_driver!(
            query,
            exec,
            fetch_all,
            |rows| rows.into_iter().map(Row::MySql).collect(),
            |rows| rows.into_iter().map(Row::Sqlite).collect(),
            |rows| rows.into_iter().map(Row::Postgres).collect()
        )
    }
}

impl<'a> Query<'a> {
    /// Binds the next `?`.
    pub(crate) fn bind(mut self, arg: impl Into<Arg<'a>>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Not kept prepared by the connection: for a statement whose text changes from call to
    /// call (a list of holds), which would otherwise push the statements that repeat out of
    /// the connection's cache of prepared statements.
    pub(crate) fn once(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// Runs a statement that returns no rows.
    pub(crate) async fn execute(self, on: impl Into<On<'_>>) -> Result<Done, sqlx::Error> {
        self.run(on.into()).await
    }

    /// Runs a query that returns at most one row.
    pub(crate) async fn fetch_optional(
        self,
        on: impl Into<On<'_>>,
    ) -> Result<Option<Row>, sqlx::Error> {
        self.run(on.into()).await
    }

    /// Runs a query for all its rows.
    pub(crate) async fn fetch_all(self, on: impl Into<On<'_>>) -> Result<Vec<Row>, sqlx::Error> {
        self.run(on.into()).await
    }

    /// Runs this statement where `on` says, for the answer `T`. On the pool it runs once
    /// more, on another connection, if the first was gone (closed by the server or a proxy
    /// while it sat idle, say): the statements dlock runs on its pool may run twice
    /// (renewals, row creation and reads are idempotent; a fence taken twice skips a token,
    /// and tokens only rise).
    async fn run<T: Answer>(&self, on: On<'_>) -> Result<T, sqlx::Error> {
        match on {
            On::Pool(pool) => {
                let mut conn = pool.acquire().await?;
                let r = T::read(self, conn.exec()).await;
                match conn.after(r) {
                    Err(e) if crate::error::connection_lost(&e) => {
                        let mut conn = pool.acquire().await?;
                        let r = T::read(self, conn.exec()).await;
                        conn.after(r)
                    }
                    r => r,
                }
            }
            On::Conn(conn) => {
                let r = T::read(self, conn.exec()).await;
                conn.check(r)
            }
            On::Exec(exec) => T::read(self, exec).await,
        }
    }

    /// Runs a query that returns exactly one row.
    pub(crate) async fn fetch_one(self, on: impl Into<On<'_>>) -> Result<Row, sqlx::Error> {
        self.fetch_optional(on)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }
}

#[cfg(feature = "mysql")]
fn mysql_done(r: sqlx::mysql::MySqlQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        // 0: the statement produced no id (every id dlock asks for is at least 1).
        last_insert_id: Some(r.last_insert_id()).filter(|id| *id != 0),
    }
}

#[cfg(feature = "postgres")]
fn pg_done(r: sqlx::postgres::PgQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        last_insert_id: None,
    }
}

#[cfg(feature = "_sqlite")]
fn sqlite_done(r: sqlx::sqlite::SqliteQueryResult) -> Done {
    Done {
        rows_affected: r.rows_affected(),
        last_insert_id: None,
    }
}
