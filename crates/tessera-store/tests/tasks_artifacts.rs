//! The TaskStore and ArtifactStore implementations: persistence and owner isolation.

mod common;

use bytes::Bytes;
use common::{open, temp_db};
use tessera_tools::{ArtifactStore, TaskFilter, TaskStore};

#[tokio::test]
async fn tasks_are_isolated_by_tenant_and_user() {
    let db = temp_db();
    let store = open(&db).await;

    let mine = store
        .add("acme", "u1", "write report", Some("by friday"))
        .await
        .unwrap();
    let second = store.add("acme", "u1", "call bob", None).await.unwrap();
    let same_user_other_tenant = store.add("beta", "u1", "beta task", None).await.unwrap();
    let other_user = store.add("acme", "u2", "u2 task", None).await.unwrap();
    assert!(mine.id.starts_with("t_") && mine.id.len() == 14);
    assert!(!mine.completed);

    let titles =
        |v: Vec<tessera_tools::Task>| -> Vec<String> { v.into_iter().map(|t| t.title).collect() };
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::All).await.unwrap()),
        ["write report", "call bob"]
    );
    assert_eq!(
        titles(store.list("beta", "u1", TaskFilter::All).await.unwrap()),
        ["beta task"]
    );
    assert_eq!(
        titles(store.list("acme", "u2", TaskFilter::All).await.unwrap()),
        ["u2 task"]
    );

    // Another owner's id behaves like an unknown id, for complete and delete.
    for (tenant, user) in [("beta", "u1"), ("acme", "u2"), ("acme", "u3")] {
        assert_eq!(store.complete(tenant, user, &mine.id).await.unwrap(), None);
        assert_eq!(store.delete(tenant, user, &mine.id).await.unwrap(), None);
    }
    assert_eq!(
        store.complete("acme", "u1", &other_user.id).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .delete("acme", "u1", &same_user_other_tenant.id)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .list("acme", "u1", TaskFilter::Completed)
            .await
            .unwrap(),
        vec![]
    );

    let done = store
        .complete("acme", "u1", &mine.id)
        .await
        .unwrap()
        .expect("own task");
    assert!(done.completed);
    assert_eq!(done.description.as_deref(), Some("by friday"));
    assert_eq!(
        titles(
            store
                .list("acme", "u1", TaskFilter::Completed)
                .await
                .unwrap()
        ),
        ["write report"]
    );
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::Pending).await.unwrap()),
        ["call bob"]
    );

    let deleted = store
        .delete("acme", "u1", &second.id)
        .await
        .unwrap()
        .expect("own task");
    assert_eq!(deleted.id, second.id);
    assert_eq!(store.delete("acme", "u1", &second.id).await.unwrap(), None);

    // The others' tasks are untouched, and everything survives a reopen.
    drop(store);
    let store = open(&db).await;
    assert_eq!(
        titles(store.list("acme", "u1", TaskFilter::All).await.unwrap()),
        ["write report"]
    );
    assert_eq!(
        store.list("beta", "u1", TaskFilter::All).await.unwrap(),
        vec![same_user_other_tenant]
    );
    assert_eq!(
        store.list("acme", "u2", TaskFilter::Pending).await.unwrap(),
        vec![other_user]
    );
}

#[tokio::test]
async fn artifacts_are_isolated_by_tenant_user_and_chat() {
    let db = temp_db();
    let store = open(&db).await;
    let content = Bytes::from_static(b"PK\x03\x04 zip bytes \x00\xff");
    let art = store
        .put("acme", "u1", "c1", "bundle.zip", content.clone())
        .await
        .unwrap();
    assert!(art.id.starts_with("art_") && art.id.len() == 20);
    assert_eq!(art.size, content.len() as u64);
    let sha = art.sha256.clone().expect("sha256 computed");
    assert_eq!(sha.len(), 64);

    let got = store
        .get("acme", "u1", "c1", &art.id)
        .await
        .unwrap()
        .expect("owner reads");
    assert_eq!(got.bytes, content);
    assert_eq!(got.meta, art);

    for (tenant, user, chat) in [
        ("beta", "u1", "c1"),
        ("acme", "u2", "c1"),
        ("acme", "u1", "c2"),
    ] {
        assert!(
            store
                .get(tenant, user, chat, &art.id)
                .await
                .unwrap()
                .is_none(),
            "{tenant}/{user}/{chat}"
        );
    }
    assert!(
        store
            .get("acme", "u1", "c1", "art_unknown")
            .await
            .unwrap()
            .is_none()
    );

    // Empty files and reopening.
    let empty = store
        .put("acme", "u1", "c1", "empty.txt", Bytes::new())
        .await
        .unwrap();
    drop(store);
    let store = open(&db).await;
    assert_eq!(
        store
            .get("acme", "u1", "c1", &art.id)
            .await
            .unwrap()
            .unwrap()
            .bytes,
        content
    );
    let e = store
        .get("acme", "u1", "c1", &empty.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((e.meta.size, e.bytes.len()), (0, 0));
    assert_eq!(
        e.meta.sha256.as_deref(),
        Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
}
