//! The two drivers behind one small private interface: typed sqlx pools and connections (no
//! `Any`, so no process-wide driver registry to collide with the application's), statements
//! with bound arguments, and rows read by position.
//!
//! The strategies write each statement once (`query(sql).bind(..).execute(on)`); this module
//! turns it into the driver's own typed query. A statement runs on a pool, a pooled connection
//! or a bare connection (the application's transaction).
//!
//! - [`pool`](mod@pool): sqlx's pool of one driver, the connections checked out of it, and the clean ones
//!   kept warm in front of it;
//! - [`query`](mod@query): statements, their arguments, and the counts they answer;
//! - [`row`](mod@row): a bare connection of one driver and a row read by position;
//! - [`open`](mod@open): the pools of a provider made from a URL, with each pool's session settings.
#![cfg_attr(
    not(any(feature = "mysql", feature = "_sqlite")),
    allow(
        dead_code,
        unused_imports,
        unused_variables,
        unreachable_code,
        clippy::needless_pass_by_value
    )
)]

mod open;
mod pool;
mod query;
mod row;

#[cfg(feature = "mysql")]
pub(crate) use open::MYSQL_LOCKS;
pub(crate) use open::{SETUP_PATIENCE, connect, setup_pauses};
#[cfg(any(feature = "mysql", feature = "_sqlite", feature = "postgres"))]
pub(crate) use open::{lock_pool_beside, server_of, statements_beside};
pub(crate) use pool::{Conn, Driver, Pool};
pub(crate) use query::{On, Query, query};
pub(crate) use row::Row;
