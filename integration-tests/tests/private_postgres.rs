//! The private PostgreSQL server the failover tests stop and restart: it starts on a random
//! port, keeps committed data across a stop, refuses connections while stopped, and is gone
//! when dropped.

use integration_tests::postgres::PrivatePostgres;

#[test]
fn a_private_postgres_keeps_committed_data_across_a_restart() {
    let server = match PrivatePostgres::start() {
        Ok(server) => server,
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no private PostgreSQL under CI=true: {why}"
            );
            eprintln!("SKIPPED a_private_postgres_keeps_committed_data_across_a_restart: {why}");
            return;
        }
    };
    assert!(server.is_accepting());
    server
        .psql("CREATE TABLE acked (n int); INSERT INTO acked VALUES (1), (2);")
        .unwrap_or_else(|e| panic!("{e}"));
    server.stop().unwrap_or_else(|e| panic!("{e}"));
    assert!(!server.is_accepting(), "stopped means unreachable");
    assert!(server.psql("SELECT 1").is_err());
    server.start_again().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        server
            .psql("SELECT sum(n) FROM acked")
            .unwrap_or_else(|e| panic!("{e}"))
            .trim(),
        "3"
    );
    let port = server.port();
    drop(server);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "dropped means stopped"
    );
}
