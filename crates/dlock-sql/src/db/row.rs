//! What the drivers hand back, below the pool and the statements: a bare connection of one
//! driver, and a row of a result read by position.

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlConnection, MySqlRow};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnection, PgRow};
#[cfg(feature = "_sqlite")]
use sqlx::sqlite::{SqliteConnection, SqliteRow};

/// A bare connection of one driver.
pub(crate) enum Exec<'c> {
    #[cfg(feature = "mysql")]
    MySql(&'c mut MySqlConnection),
    #[cfg(feature = "_sqlite")]
    Sqlite(&'c mut SqliteConnection),
    #[cfg(feature = "postgres")]
    Postgres(&'c mut PgConnection),
    /// Without a driver there is no connection.
    #[cfg(not(any(feature = "mysql", feature = "_sqlite", feature = "postgres")))]
    Unused(std::marker::PhantomData<&'c ()>, std::convert::Infallible),
}

/// Whether `v` is a value that decodes as `Other` and not as `i64` (NULL is neither).
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn only<DB, Other>(v: &<DB as sqlx::Database>::ValueRef<'_>) -> bool
where
    DB: sqlx::Database,
    i64: sqlx::Type<DB>,
    Other: sqlx::Type<DB>,
{
    use sqlx::ValueRef as _;
    if v.is_null() {
        return false;
    }
    let ty = v.type_info();
    !<i64 as sqlx::Type<DB>>::compatible(&ty) && Other::compatible(&ty)
}

/// A row of a result, read by column position.
pub(crate) enum Row {
    #[cfg(feature = "mysql")]
    MySql(MySqlRow),
    #[cfg(feature = "_sqlite")]
    Sqlite(SqliteRow),
    #[cfg(feature = "postgres")]
    Postgres(PgRow),
}

impl Row {
    /// An integer column (MySQL's unsigned ones too, such as `CONNECTION_ID()`, if they fit).
    ///
    /// The width is chosen from the column's type, not by trying one and falling back: a
    /// failed `try_get` builds an error with a formatted message, which the hot path (the
    /// answer of PostgreSQL's advisory unlock, an `int4`, every cycle) must not pay for.
    pub(crate) fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
        use sqlx::Row as _;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => {
                if r.try_get_raw(i).is_ok_and(|v| only::<sqlx::MySql, u64>(&v)) {
                    let v = r.try_get::<u64, _>(i)?;
                    i64::try_from(v).map_err(|e| sqlx::Error::Decode(Box::new(e)))
                } else {
                    r.try_get::<i64, _>(i)
                }
            }
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref r) => r.try_get::<i64, _>(i),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => {
                if r.try_get_raw(i)
                    .is_ok_and(|v| only::<sqlx::Postgres, i32>(&v))
                {
                    r.try_get::<i32, _>(i).map(i64::from)
                } else {
                    r.try_get::<i64, _>(i)
                }
            }
        }
    }

    /// Column `i` as an integer, `None` if it is NULL.
    pub(crate) fn optional_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
        if self.is_null(i)? {
            Ok(None)
        } else {
            self.int(i).map(Some)
        }
    }

    /// Whether column `i` is NULL.
    pub(crate) fn is_null(&self, i: usize) -> Result<bool, sqlx::Error> {
        use sqlx::{Row as _, ValueRef as _};
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => r.try_get_raw(i).map(|v| v.is_null()),
        }
    }

    /// A binary column (a lock name).
    pub(crate) fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        use sqlx::Row as _;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => r.try_get::<Vec<u8>, _>(i),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref r) => r.try_get::<Vec<u8>, _>(i),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => r.try_get::<Vec<u8>, _>(i),
        }
    }

    /// A text column.
    pub(crate) fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        use sqlx::Row as _;
        match *self {
            #[cfg(feature = "mysql")]
            Self::MySql(ref r) => r.try_get::<String, _>(i),
            #[cfg(feature = "_sqlite")]
            Self::Sqlite(ref r) => r.try_get::<String, _>(i),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref r) => r.try_get::<String, _>(i),
        }
    }
}
