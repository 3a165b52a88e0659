//! An application that registered its own sqlx `Any` drivers can still use dlock: the
//! library uses the typed drivers and never touches the process-wide `Any` registry (where
//! `install_default_drivers()` panics once other drivers are installed).
//!
//! A test binary of its own: the registry is global to the process.

use dlock_core::LockProvider;
use dlock_sql::SqlProvider;

#[tokio::test]
async fn connects_after_the_application_installed_its_own_any_drivers() {
    // The application's choice: only SQLite through `Any`.
    sqlx::any::install_drivers(&[sqlx::sqlite::any::DRIVER]).expect("the first install");
    let dir = std::env::temp_dir().join(format!("dlock-own-drivers-{}", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}/locks.db", dir.display());
    let locks = SqlProvider::connect(&url).await.expect("connect");
    let lock = locks.lock("jobs/1", Default::default()).unwrap();
    let guard = lock.try_acquire(std::time::Duration::ZERO).await.unwrap();
    assert!(guard.is_some(), "a free lock");
    // The application's own `Any` pool still works beside dlock.
    let any = sqlx::AnyPool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.display()))
        .await
        .expect("the application's Any pool");
    any.close().await;
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
