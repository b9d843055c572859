//! Test support (cargo feature `testing`): a PostgreSQL schema of its own per test, so tests
//! on one database run in parallel, for this crate's conformance suite, the server tests and
//! the cluster tests alike.
//!
//! The database is named by [`DATABASE_ENV`]. Without it, [`PgTestSchema::create`] prints
//! that the test is skipped and returns `None`; under `CI=true` it panics instead, so CI
//! cannot skip PostgreSQL silently.

use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// The variable naming the PostgreSQL database tests may use, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`.
pub const DATABASE_ENV: &str = "TESSERA_TEST_DATABASE_URL";

/// A schema of the test database, created for one test and dropped (with everything in it)
/// when this value is dropped, pass or fail.
pub struct PgTestSchema {
    base_url: String,
    base: PgConnectOptions,
    /// The schema's name (`t_` and a random suffix); also the connections' application name.
    pub name: String,
}

impl PgTestSchema {
    /// A fresh schema, or `None` (after printing why `test` is skipped) when no database is
    /// configured. Panics under `CI=true` without a database, or when it cannot be reached.
    pub async fn create(test: &str) -> Option<Self> {
        let Some(base_url) = std::env::var(DATABASE_ENV).ok().filter(|u| !u.is_empty()) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{DATABASE_ENV} is not set, and CI=true requires the PostgreSQL tests to run"
            );
            eprintln!("skipped {test} on PostgreSQL: {DATABASE_ENV} is not set");
            return None;
        };
        let base = PgConnectOptions::from_str(&base_url)
            .unwrap_or_else(|e| panic!("{DATABASE_ENV} is not a PostgreSQL url: {e}"));
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut admin = admin(&base).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("cannot create the test schema: {e}"));
        let _ = admin.close().await;
        Some(Self {
            base_url,
            base,
            name,
        })
    }

    /// Connection options whose `search_path` is this schema and whose application name is
    /// the schema's (so [`PgTestSchema::kill_connections`] finds them).
    pub fn options(&self) -> PgConnectOptions {
        self.base
            .clone()
            .application_name(&self.name)
            .options([("search_path", &self.name)])
    }

    /// The same as a `store.url` for a server process.
    pub fn url(&self) -> String {
        let sep = if self.base_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!(
            "{}{sep}application_name={name}&options=-c%20search_path%3D{name}",
            self.base_url,
            name = self.name
        )
    }

    /// Terminates every server connection opened with [`PgTestSchema::options`] or
    /// [`PgTestSchema::url`], as a PostgreSQL restart would; returns how many there were.
    pub async fn kill_connections(&self) -> usize {
        let mut admin = admin(&self.base).await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&self.name)
        .fetch_all(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("cannot terminate the test's connections: {e}"));
        let _ = admin.close().await;
        killed.into_iter().filter(|k| *k).count()
    }
}

impl Drop for PgTestSchema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // Drop may run inside the test's runtime, which must not block: a thread of its own.
        let dropped = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut admin) = PgConnection::connect_with(&base).await {
                    let sql = format!("DROP SCHEMA IF EXISTS {name} CASCADE");
                    if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut admin)
                        .await
                    {
                        eprintln!("could not drop test schema {name}: {e}");
                    }
                    let _ = admin.close().await;
                }
            });
        });
        let _ = dropped.join();
    }
}

async fn admin(base: &PgConnectOptions) -> PgConnection {
    PgConnection::connect_with(base)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {DATABASE_ENV}: {e}"))
}
