//! Routing between nodes over a real NATS server: commands reach the chat's owner and come
//! back answered; with no owner or a silent one the forwarder gets a clear error in time;
//! live events reach another node's subscriber in order.

mod common;

use std::time::Duration;

use futures::StreamExt;
use tessera_cluster::{ChatCommand, ClusterError, CommandReply, LiveEvent};

#[actix_rt::test]
async fn a_command_reaches_the_owner_and_its_answer_comes_back() {
    let Some(url) = common::nats_url("a_command_reaches_the_owner") else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::node_bus(&url, "owner", &prefix, Duration::from_secs(5)).await;
    let other = common::node_bus(&url, "other", &prefix, Duration::from_secs(5)).await;
    let mut commands = owner.serve_commands("chat-1").await.expect("subscribe");
    let serving = owner.clone();
    let server = actix_rt::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..2 {
            let incoming = commands.next().await.expect("a command");
            seen.push(incoming.command.clone());
            let reply = match &incoming.command {
                ChatCommand::Cancel => CommandReply::Refused {
                    code: "nothing_to_cancel".into(),
                    message: "no run".into(),
                    status: Some(409),
                },
                _ => CommandReply::Accepted,
            };
            serving.reply(incoming, &reply).await.expect("reply");
        }
        seen
    });
    let input = ChatCommand::Input {
        content: "hello".into(),
        client_msg_id: Some("m1".into()),
    };
    assert_eq!(
        other
            .send_command("chat-1", &input)
            .await
            .expect("answered"),
        CommandReply::Accepted
    );
    let refused = other
        .send_command("chat-1", &ChatCommand::Cancel)
        .await
        .expect("answered");
    assert!(matches!(refused, CommandReply::Refused { code, .. } if code == "nothing_to_cancel"));
    assert_eq!(
        server.await.expect("server task"),
        vec![input, ChatCommand::Cancel],
        "the owner saw both commands, in order"
    );
}

#[actix_rt::test]
async fn no_owner_and_a_silent_owner_are_told_apart() {
    let Some(url) = common::nats_url("no_owner_and_a_silent_owner") else {
        return;
    };
    let prefix = common::unique_prefix();
    let forwarder = common::node_bus(&url, "fwd", &prefix, Duration::from_millis(300)).await;
    let err = forwarder
        .send_command("orphan", &ChatCommand::Cancel)
        .await
        .expect_err("nobody serves the chat");
    assert!(
        matches!(err, ClusterError::NoOwner(ref c) if c == "orphan"),
        "{err:?}"
    );

    // An owner that subscribed but never answers (paused, overloaded).
    let silent = common::node_bus(&url, "silent", &prefix, Duration::from_secs(5)).await;
    let _commands = silent.serve_commands("stuck").await.expect("subscribe");
    let err = forwarder
        .send_command("stuck", &ChatCommand::Cancel)
        .await
        .expect_err("no answer");
    assert!(matches!(err, ClusterError::Timeout(_)), "{err:?}");
}

#[actix_rt::test]
async fn live_events_reach_another_node_in_order_one_message_per_burst() {
    let Some(url) = common::nats_url("live_events_reach_another_node") else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::node_bus(&url, "owner", &prefix, Duration::from_secs(5)).await;
    let relay = common::node_bus(&url, "relay", &prefix, Duration::from_secs(5)).await;
    let mut events = relay.subscribe_events("chat-9").await.expect("subscribe");
    let mut other_chat = relay.subscribe_events("chat-10").await.expect("subscribe");
    let event = |seq: u64| LiveEvent {
        seq,
        envelope: format!(r#"{{"seq":{seq}}}"#).into(),
    };
    // Bursts of 1 to 9 events, 45 in all; then one with an event over the batch limit in
    // the middle, which goes alone: three messages.
    let bursts: Vec<Vec<LiveEvent>> = (1..=9u64)
        .map(|n| (n * (n - 1) / 2 + 1..=n * (n + 1) / 2).map(event).collect())
        .collect();
    for burst in &bursts {
        owner
            .publish_events("chat-9", burst)
            .await
            .expect("publish");
    }
    let big = LiveEvent {
        seq: 47,
        envelope: vec![b'x'; 300 * 1024].into(),
    };
    let last = [event(46), big.clone(), event(48)];
    owner
        .publish_events("chat-9", &last)
        .await
        .expect("publish");
    owner
        .publish_events("chat-10", &[event(1)])
        .await
        .expect("publish");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("in time")
            .expect("a burst")
    };
    for burst in &bursts {
        assert_eq!(&next().await, burst, "one message per burst, as published");
    }
    assert_eq!(next().await, vec![event(46)]);
    assert_eq!(next().await, vec![big], "alone: over the batch limit");
    assert_eq!(next().await, vec![event(48)]);
    let other = tokio::time::timeout(Duration::from_secs(5), other_chat.next())
        .await
        .expect("in time")
        .expect("an event");
    assert_eq!(other, vec![event(1)], "each chat has its own subject");
    assert!(owner.round_trip().await.expect("rtt") < Duration::from_secs(5));
}

#[actix_rt::test]
async fn a_stream_reaches_the_forwarder_in_order_and_only_an_inbox_can_receive_one() {
    use tessera_cluster::{NumberedFrame, StreamFrame};
    let Some(url) = common::nats_url("a_stream_reaches_the_forwarder") else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::node_bus(&url, "owner", &prefix, Duration::from_secs(5)).await;
    let forwarder = common::node_bus(&url, "fwd", &prefix, Duration::from_secs(5)).await;
    let (inbox, mut frames) = forwarder.open_stream().await.expect("open");
    let sent: Vec<NumberedFrame> = (0..100u64)
        .map(|n| NumberedFrame {
            n,
            frame: match n {
                99 => StreamFrame::End,
                n if n % 10 == 0 => StreamFrame::KeepAlive,
                n => StreamFrame::Data(format!("data: {n}\n\n").into()),
            },
        })
        .collect();
    for frame in &sent {
        owner.send_stream_frame(&inbox, frame).await.expect("send");
    }
    for expected in &sent {
        let got = tokio::time::timeout(Duration::from_secs(5), frames.next())
            .await
            .expect("in time")
            .expect("a frame");
        assert_eq!(&got, expected);
    }
    // A command cannot point an owner's stream at a chat's subjects.
    let events = owner.subjects().events("chat-1");
    assert!(owner.send_stream_frame(&events, &sent[0]).await.is_err());
}

#[actix_rt::test]
async fn follows_and_hand_overs_name_the_node_that_sent_them() {
    let Some(url) = common::nats_url("commands_name_their_sender") else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::node_bus(&url, "owner", &prefix, Duration::from_secs(5)).await;
    let other = common::node_bus(&url, "node-b", &prefix, Duration::from_secs(5)).await;
    let mut commands = owner.serve_commands("chat-1").await.expect("subscribe");
    let serving = owner.clone();
    let server = actix_rt::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let incoming = commands.next().await.expect("a command");
            seen.push(incoming.from.clone());
            serving
                .reply(incoming, &CommandReply::Accepted)
                .await
                .expect("reply");
        }
        seen
    });
    for command in [
        ChatCommand::Follow,
        ChatCommand::Cancel,
        ChatCommand::HandOver,
    ] {
        other
            .send_command("chat-1", &command)
            .await
            .expect("answered");
    }
    assert_eq!(
        server.await.expect("server task"),
        vec![Some("node-b".to_owned()), None, Some("node-b".to_owned())]
    );
}

#[actix_rt::test]
async fn a_drained_command_stream_yields_what_reached_it_then_ends() {
    let Some(url) = common::nats_url("a_drained_command_stream") else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::node_bus(&url, "owner", &prefix, Duration::from_secs(5)).await;
    let other = common::node_bus(&url, "other", &prefix, Duration::from_secs(5)).await;
    let (mut commands, mut drain) = owner
        .serve_commands_until_drained("chat-1")
        .await
        .expect("subscribe");
    // A command that reaches the owner before it stops serving, not read yet (its relay is
    // busy, say). The round trip on the same connection comes back only once the server has
    // handled the command, and sent it on to the owner.
    let inbox = other.client().new_inbox();
    let mut replies = other
        .client()
        .subscribe(inbox.clone())
        .await
        .expect("inbox");
    let body = serde_json::to_vec(&ChatCommand::Cancel).expect("encode");
    other
        .client()
        .publish_with_reply(other.subjects().commands("chat-1"), inbox, body.into())
        .await
        .expect("sent");
    other.round_trip().await.expect("round trip");

    drain.drain();
    let incoming = tokio::time::timeout(Duration::from_secs(5), commands.next())
        .await
        .expect("not stuck")
        .expect("the command that reached the owner");
    assert_eq!(incoming.command, ChatCommand::Cancel);
    owner
        .reply(incoming, &CommandReply::Accepted)
        .await
        .expect("reply");
    let answer = tokio::time::timeout(Duration::from_secs(5), replies.next())
        .await
        .expect("answered in time")
        .expect("an answer");
    assert_eq!(
        serde_json::from_slice::<CommandReply>(&answer.payload).expect("decode"),
        CommandReply::Accepted
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), commands.next())
            .await
            .expect("the stream ends")
            .is_none()
    );
    // No longer served: the next command finds no responders at once.
    assert!(matches!(
        other.send_command("chat-1", &ChatCommand::Cancel).await,
        Err(ClusterError::NoOwner(_))
    ));
}
