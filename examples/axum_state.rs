//! `Locks` in an axum application's state: connect once at start-up, clone the handle into
//! every request (a clone is cheap and shares the connections), lock per resource.
//!
//! ```text
//! cargo run --example axum_state                       # serves one request to itself, exits
//! cargo run --example axum_state -- redis://127.0.0.1  # any URL dlock::connect takes
//! ```

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use dlock::Locks;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `POST /orders/{id}/ship`: only one request ships an order at a time, across every instance
/// of the service that shares the store.
async fn ship(State(locks): State<Locks>, Path(id): Path<u64>) -> (StatusCode, String) {
    let lock = match locks.lock(&format!("orders/{id}")) {
        Ok(l) => l,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()),
    };
    match lock.try_acquire(Duration::from_millis(500)).await {
        Ok(Some(guard)) => {
            let token = guard.fencing_token();
            // ... write the shipment, with `token` as its fence ...
            let released = guard.release().await;
            match released {
                Ok(()) => (
                    StatusCode::OK,
                    format!("order {id} shipped under token {token}\n"),
                ),
                Err(e) => (StatusCode::CONFLICT, format!("the lock was lost: {e}\n")),
            }
        }
        Ok(None) => (
            StatusCode::CONFLICT,
            format!("order {id} is being shipped\n"),
        ),
        Err(e) if e.is_retryable() => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    // Once, at start-up: every connect opens new pools or sessions.
    let locks = dlock::connect(&url).await?;
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship))
        .with_state(locks);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // A client, so the example shows one request end to end and exits.
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"POST /orders/42/ship HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .await?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).await?;
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    print!("{body}");
    server.abort();
    Ok(())
}
