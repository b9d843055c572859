//! The REST API under `/api/v1`, plus health, readiness and metrics. Errors are JSON
//! `{code, message}` with the matching status; a chat of another tenant or user answers 404
//! exactly like a chat that does not exist.
//!
//! Every `/api/v1` route authenticates its caller (see `auth.rs`); `/healthz`, `/readyz` and
//! `/metrics` stay open because they carry no chat data (the only tenant label is on the token
//! usage series) — put them behind the network boundary if tenant ids or counts are
//! sensitive.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};
use futures::future::{LocalBoxFuture, Ready, ready};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tessera_cluster::{ChatCommand, CommandReply};
use tessera_engine::session::{
    CancelRun, ChatSnapshot, GetSnapshot, Observed, ToolAnswer, Unsubscribe, UserInput, Watch,
};
use tessera_engine::{ChatHandle, EngineError, NewChat};
use tessera_protocol::{ErrorCode, ServerEvent, ToolCallEvent};
use tokio::sync::oneshot;

use crate::auth::{AuthError, Caller};
use crate::cluster::{ForwardError, RemoteChat};
use crate::limits::QuotaRefusal;
use crate::registry::{FindChat, OpenChat, RegisterChat};
use crate::serve::AppState;
use crate::ws::ChatLink;

/// A REST error: status, stable code, and a sentence for humans.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: Cow<'static, str>,
    message: String,
    /// Seconds for a `Retry-After` header (429s, and 503s a retry may cure).
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: Cow::Borrowed(code),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The stable error code.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// This error as the owner of a chat answers a forwarded command with it, so the
    /// forwarding node answers the same status and body.
    pub(crate) fn to_refusal(&self) -> CommandReply {
        CommandReply::Refused {
            code: self.code.to_string(),
            message: self.message.clone(),
            status: Some(self.status.as_u16()),
        }
    }

    /// The error an owner refused a forwarded command with (see [`Self::to_refusal`]); a
    /// refusal without a status is the owner's bug or an older node: 500.
    fn from_refusal(code: String, message: String, status: Option<u16>) -> Self {
        let status = status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self {
            status,
            code: Cow::Owned(code),
            message,
            retry_after: None,
        }
    }

    /// A missing (or someone else's) resource.
    pub(crate) fn is_not_found(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such chat")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if let Some(seconds) = self.retry_after {
            response.insert_header(("Retry-After", seconds.to_string()));
        }
        response.json(json!({"code": &*self.code, "message": self.message}))
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        let status = match &err {
            EngineError::UnknownWorkflow(_) => StatusCode::NOT_FOUND,
            EngineError::NotAcceptingInput(_) => StatusCode::CONFLICT,
            EngineError::Correlation(_) => StatusCode::NOT_FOUND,
            EngineError::InvalidToolResponse(_) | EngineError::Workflow(_) => {
                StatusCode::BAD_REQUEST
            }
            EngineError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, err.code().as_str(), err.to_string())
    }
}

pub(crate) fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the chat is not running",
    )
}

/// What a client is told to wait before retrying a request its chat's node did not take.
const OWNER_RETRY_AFTER_S: u64 = 2;

/// The chat's node could not be reached: 503 with `Retry-After`, never a hang.
pub(crate) fn owner_unreachable(error: ForwardError) -> ApiError {
    let mut api = match error {
        ForwardError::Timeout => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_timeout",
            "the chat's node did not answer in time; it may have carried the request out, \
             so check the chat before retrying",
        ),
        ForwardError::NoOwner | ForwardError::Bus => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unavailable",
            "no node serves the chat right now (its node may have stopped; another takes the \
             chat over once its lease expires); retry",
        ),
    };
    api.retry_after = Some(OWNER_RETRY_AFTER_S);
    api
}

/// The error of an owner's answer that is not the one the request needed.
pub(crate) fn refusal_error(reply: CommandReply) -> ApiError {
    match reply {
        CommandReply::Refused {
            code,
            message,
            status,
        } => ApiError::from_refusal(code, message, status),
        CommandReply::Accepted | CommandReply::Answered { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::Internal.as_str(),
            "the chat's node answered something else",
        ),
    }
}

/// Sends `command` to the node that runs a chat for this one and returns the JSON it answered
/// with (`None`: accepted); its refusal as the same status and body it would have answered.
pub(crate) async fn forward(
    remote: &RemoteChat,
    command: ChatCommand,
) -> Result<Option<Value>, ApiError> {
    match remote.send(command).await.map_err(owner_unreachable)? {
        CommandReply::Accepted => Ok(None),
        CommandReply::Answered { body } => Ok(Some(body)),
        refused @ CommandReply::Refused { .. } => Err(refusal_error(refused)),
    }
}

/// The authenticated caller of a request: every `/api/v1` handler that takes one checks the
/// credential before anything else (see `auth.rs`).
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(app_state(req).and_then(|state| state.auth.caller(req).map_err(caller_error)))
    }
}

/// The shared state the server was started with.
fn app_state(req: &HttpRequest) -> Result<web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(unavailable)
}

/// The chat named by the route's `{id}`, owned by the authenticated caller; a chat of anyone
/// else is 404, exactly like one that does not exist. In a cluster the chat may run on
/// another node (`ChatLink::Remote`): the caller's right to it was checked here, from the
/// store, and the handler forwards what it does to that node.
pub struct OwnedChat {
    pub caller: Caller,
    pub chat: ChatLink,
}

impl FromRequest for OwnedChat {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let found = app_state(req).and_then(|state| {
            let caller = state.auth.caller(req).map_err(caller_error)?;
            let chat_id = req.match_info().get("id").unwrap_or_default().to_owned();
            Ok((state, caller, chat_id))
        });
        Box::pin(async move {
            let (state, caller, chat_id) = found?;
            let chat = match (
                locate_chat(&state, &caller, &chat_id).await?,
                &state.cluster,
            ) {
                (ChatLink::Remote(remote), Some(cluster)) => {
                    ChatLink::Remote(remote.with_patience(cluster.rest_patience))
                }
                (chat, _) => chat,
            };
            Ok(OwnedChat { caller, chat })
        })
    }
}

/// The REST error of a refused credential.
fn caller_error(e: AuthError) -> ApiError {
    match e {
        AuthError::Missing => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send Authorization: Bearer <api key>",
        ),
        AuthError::Invalid => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the credential is not valid",
        ),
        AuthError::Origin => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden_origin",
            "this origin may not call the API",
        ),
    }
}

/// Spends one REST input of `caller` (see `RestInputBudget`); over budget: 429 with
/// `Retry-After`.
async fn spend_input_budget(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    state
        .rest_budget
        .spend(&state.tenant_budget, &caller.tenant, &caller.user)
        .await
        .map_err(|wait| {
            let mut error = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimited.as_str(),
                "too many inputs; slow down",
            );
            error.retry_after = Some(wait.as_secs().max(1));
            error
        })
}

/// The caller's chat `chat_id`, or 404.
pub(crate) async fn owned_chat(
    state: &AppState,
    caller: &Caller,
    chat_id: &str,
) -> Result<ChatHandle, ApiError> {
    // A chat not in memory (completed, or open and left idle, or from before a restart) is
    // rebuilt from the store by the registry, once however many lookups ask at the same time.
    state
        .registry
        .send(OpenChat {
            chat_id: chat_id.to_owned(),
            tenant: caller.tenant.clone(),
            user: caller.user.clone(),
        })
        .await
        .map_err(|_| unavailable())?
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal.as_str(),
                e.to_string(),
            )
        })?
        .ok_or_else(ApiError::not_found)
}

/// Where the caller's chat `chat_id` runs: here, or (in a cluster) on another node. An open
/// chat no node owns is taken over here; 404 for a chat of anyone else.
pub(crate) async fn locate_chat(
    state: &AppState,
    caller: &Caller,
    chat_id: &str,
) -> Result<ChatLink, ApiError> {
    use crate::cluster::Claimed;
    let Some(cluster) = &state.cluster else {
        return owned_chat(state, caller, chat_id)
            .await
            .map(ChatLink::Local);
    };
    let found = state
        .registry
        .send(FindChat {
            chat_id: chat_id.to_owned(),
            tenant: caller.tenant.clone(),
            user: caller.user.clone(),
        })
        .await
        .map_err(|_| unavailable())?;
    if let Some(chat) = found {
        return Ok(ChatLink::Local(chat));
    }
    // The store says whose chat it is and whether it is still open.
    let stored = state.chats.load_chat(chat_id).await.map_err(|e| {
        tracing::warn!(chat_id, error = %e, "cannot read the chat's record");
        unavailable()
    })?;
    let Some(stored) =
        stored.filter(|c| *c.record.tenant == *caller.tenant && *c.record.user_id == *caller.user)
    else {
        return Err(ApiError::not_found());
    };
    if stored.state.status == tessera_store::STATUS_COMPLETED {
        return owned_chat(state, caller, chat_id)
            .await
            .map(ChatLink::Local);
    }
    let claimed = cluster
        .node
        .send(crate::cluster::ClaimChat(chat_id.to_owned()))
        .await
        .map_err(|_| unavailable())?
        .map_err(|e| {
            tracing::warn!(chat_id, error = %e, "cannot claim the chat");
            unavailable()
        })?;
    match claimed {
        Claimed::Local(chat) => Ok(ChatLink::Local(chat)),
        Claimed::Remote => Ok(ChatLink::Remote(
            RemoteChat::new(
                std::sync::Arc::from(chat_id),
                cluster.bus.clone(),
                state.chats.clone(),
                cluster.node.clone(),
                cluster.patience,
            )
            .handing_over(cluster.hand_over_sockets),
        )),
        Claimed::NotOpen => owned_chat(state, caller, chat_id)
            .await
            .map(ChatLink::Local),
    }
}

/// Registers all routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .service(
            web::scope("/api/v1")
                .route("/workflows", web::get().to(list_workflows))
                .route("/chats", web::post().to(create_chat))
                .route("/chats", web::get().to(list_chats))
                .route("/chats/{id}", web::get().to(get_chat))
                .route("/chats/{id}", web::delete().to(delete_chat))
                .route("/chats/{id}/messages", web::get().to(get_messages))
                .route("/chats/{id}/cancel", web::post().to(cancel_chat))
                .route("/chats/{id}/input", web::post().to(post_input))
                .route(
                    "/chats/{id}/tool-responses",
                    web::post().to(post_tool_response),
                )
                .route("/chats/{id}/files/{file}", web::get().to(download_file))
                .route("/chats/{id}/ws", web::get().to(websocket))
                .route("/ws-ticket", web::post().to(ws_ticket))
                .route("/run", web::post().to(run_workflow))
                .route("/usage", web::get().to(usage))
                .route("/agui/{workflow}", web::post().to(crate::agui::run)),
        );
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if state.shutting_down.load(Ordering::Relaxed) {
        return HttpResponse::ServiceUnavailable().json(json!({"status": "shutting_down"}));
    }
    let failing = state.readiness.failing().await;
    if !failing.is_empty() {
        tracing::warn!(failing = ?failing, "not ready: dependencies do not answer");
        return HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unavailable", "failing": failing}));
    }
    HttpResponse::Ok().json(json!({"status": "ready", "workflows": state.workflows.len()}))
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let mut text = state.metrics.render();
    crate::metrics::write_metric(
        &mut text,
        "tessera_chats_in_memory",
        "Chat sessions held in memory (completed and idle open ones leave and are rebuilt on demand).",
        "gauge",
        i64::try_from(state.engine.chats_in_memory()).unwrap_or(i64::MAX),
    );
    if let Some(cluster) = &state.cluster_metrics {
        crate::metrics::render_cluster(&mut text, cluster);
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text)
}

/// The caller's tenant's token usage, counted on this node since it started.
async fn usage(caller: Caller, state: web::Data<AppState>) -> HttpResponse {
    let usage = state.metrics.usage.of(&caller.tenant);
    HttpResponse::Ok().json(json!({
        "tenant": &*caller.tenant,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "model_calls": usage.model_calls,
    }))
}

async fn list_workflows(_: Caller, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    // Unlisted workflows (`"listed": false`) can still be started by name.
    let listed: Vec<&Value> = state
        .workflows
        .iter()
        .filter(|w| w["listed"] != false)
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "workflows": listed })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateChat {
    workflow: String,
    #[serde(default)]
    context: Map<String, Value>,
}

async fn create_chat(
    caller: Caller,
    state: web::Data<AppState>,
    body: web::Json<CreateChat>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let handle = start_chat(&state, &caller, body.workflow, body.context, None).await?;
    let chat_id = handle.identity.chat_id.to_string();
    Ok(HttpResponse::Created().json(json!({
        "chat_id": chat_id,
        "workflow": handle.workflow,
        "ws_url": format!("/api/v1/chats/{chat_id}/ws"),
    })))
}

pub(crate) async fn start_chat(
    state: &AppState,
    caller: &Caller,
    workflow: String,
    context: Map<String, Value>,
    chat_id: Option<String>,
) -> Result<ChatHandle, ApiError> {
    let limit = state.limits.max_open_chats_per_tenant;
    let slot = match state
        .chat_quota
        .reserve(state.chats.as_ref(), &caller.tenant, limit)
        .await
    {
        Ok(slot) => slot,
        Err(QuotaRefusal::Full) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_chats",
                format!("at most {limit} open chats per tenant; finish or cancel one first"),
            ));
        }
        Err(QuotaRefusal::Unavailable) => return Err(unavailable()),
    };
    let new = NewChat {
        tenant: caller.tenant.to_string(),
        user: caller.user.to_string(),
        workflow,
        context,
        chat_id,
    };
    let created = match &state.cluster {
        None => state.engine.start_chat(new).await.map_err(ApiError::from),
        Some(cluster) => start_leased_chat(state, cluster, new).await,
    };
    let handle = match created {
        Ok(handle) => handle,
        Err(e) => {
            slot.abandon().await;
            return Err(e);
        }
    };
    if state
        .registry
        .send(RegisterChat(handle.clone()))
        .await
        .is_err()
    {
        slot.abandon().await;
        return Err(unavailable());
    }
    slot.opened();
    state.metrics.chats_created.fetch_add(1, Ordering::Relaxed);
    state.metrics.chats_open.fetch_add(1, Ordering::Relaxed);
    tracing::info!(chat_id = %handle.identity.chat_id, tenant = %caller.tenant, workflow = %handle.workflow, "chat created");
    Ok(handle)
}

/// Starts a chat in a cluster: its lease first, so every durable write of it is fenced from
/// the start and no other node can take it.
async fn start_leased_chat(
    state: &AppState,
    cluster: &crate::serve::ClusterHandles,
    mut new: NewChat,
) -> Result<ChatHandle, ApiError> {
    let chat_id = new
        .chat_id
        .get_or_insert_with(|| format!("chat_{}", uuid::Uuid::new_v4().simple()))
        .clone();
    let epoch = cluster
        .node
        .send(crate::cluster::LeaseNewChat(chat_id.clone()))
        .await
        .map_err(|_| unavailable())?
        .map_err(|e| {
            tracing::warn!(chat_id = %chat_id, error = %e, "cannot take the new chat's lease");
            unavailable()
        })?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "this node is shutting down; retry on another",
            )
        })?;
    let handle = state.engine.start_fenced_chat(new, Some(epoch)).await?;
    cluster.node.do_send(crate::cluster::ServeChat {
        chat: handle.clone(),
        epoch,
    });
    Ok(handle)
}

/// The caller's chats, newest first, one page at a time. Read from the store, so the list
/// includes every chat ever created, also those finished before a restart (which are not
/// held in memory); `status` is as of the last flush of each chat.
async fn list_chats(
    caller: Caller,
    state: web::Data<AppState>,
    paging: web::Query<Paging>,
) -> Result<HttpResponse, ApiError> {
    let limit = paging.limit.clamp(1, 500);
    let offset = u32::try_from(paging.offset).unwrap_or(u32::MAX);
    let chats = state
        .chats
        .list_chats(
            &caller.tenant,
            &caller.user,
            u32::try_from(limit).unwrap_or(500),
            offset,
        )
        .await
        .map_err(|error| {
            tracing::error!(tenant = %caller.tenant, %error, "listing chats failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the chat list cannot be read right now",
            )
        })?;
    let list: Vec<Value> = chats
        .iter()
        .map(|c| {
            json!({
                "chat_id": c.record.chat_id,
                "workflow": c.record.workflow,
                "status": c.state.status,
                "created_at_ms": c.record.created_at_ms,
                "updated_at_ms": c.state.updated_at_ms,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"chats": list, "offset": paging.offset, "limit": limit})))
}

pub(crate) async fn snapshot(chat: &ChatHandle) -> Result<ChatSnapshot, ApiError> {
    chat.addr.send(GetSnapshot).await.map_err(|_| unavailable())
}

/// The chat as `GET /chats/{id}` shows it (also what its owner answers another node).
pub(crate) fn chat_json(snap: &ChatSnapshot) -> Value {
    json!({
        "chat_id": &*snap.chat_id,
        "workflow": snap.workflow,
        "status": snap.status.as_str(),
        "current_agent": &*snap.current_agent,
        "turn": snap.turn,
        "last_seq": snap.last_seq,
        "persisted_seq": snap.persisted_seq,
        "context": snap.visible_context,
        "pending_ui_calls": snap.pending_ui_calls,
    })
}

async fn get_chat(OwnedChat { chat, .. }: OwnedChat) -> Result<HttpResponse, ApiError> {
    let body = match chat {
        ChatLink::Local(chat) => chat_json(&snapshot(&chat).await?),
        ChatLink::Remote(remote) => answered(forward(&remote, ChatCommand::Snapshot).await?)?,
    };
    Ok(HttpResponse::Ok().json(body))
}

/// The JSON a read forwarded to the chat's owner must have come back with.
fn answered(body: Option<Value>) -> Result<Value, ApiError> {
    body.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::Internal.as_str(),
            "the chat's node answered a read without data",
        )
    })
}

#[derive(Deserialize)]
struct Paging {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    50
}

/// One page of the chat's transcript as `GET /chats/{id}/messages` shows it (also what its
/// owner answers another node).
pub(crate) fn messages_json(snap: &ChatSnapshot, offset: usize, limit: usize) -> Value {
    let limit = limit.clamp(1, 500);
    let total = snap.transcript.len();
    let page: Vec<Value> = snap
        .transcript
        .iter()
        .skip(offset)
        .take(limit)
        .map(|m| json!({"message_id": m.message_id, "role": m.role, "agent": m.agent, "content": m.content, "ui_hidden": m.ui_hidden}))
        .collect();
    json!({"messages": page, "offset": offset, "limit": limit, "total": total})
}

async fn get_messages(
    OwnedChat { chat, .. }: OwnedChat,
    paging: web::Query<Paging>,
) -> Result<HttpResponse, ApiError> {
    let body = match chat {
        ChatLink::Local(chat) => {
            messages_json(&snapshot(&chat).await?, paging.offset, paging.limit)
        }
        ChatLink::Remote(remote) => {
            let command = ChatCommand::Messages {
                offset: u64::try_from(paging.offset).unwrap_or(u64::MAX),
                limit: u64::try_from(paging.limit).unwrap_or(u64::MAX),
            };
            answered(forward(&remote, command).await?)?
        }
    };
    Ok(HttpResponse::Ok().json(body))
}

/// Deletes the caller's chat and everything kept for it (see `lifecycle`); 404 for a chat
/// of anyone else.
async fn delete_chat(
    caller: Caller,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let chat_id = path.into_inner();
    stop_on_its_node(&state, &caller, &chat_id).await;
    let deleted = crate::lifecycle::delete_owned_chat(
        &state.chats,
        &state.registry,
        &state.metrics,
        &caller,
        &chat_id,
    )
    .await
    .map_err(|error| {
        tracing::error!(chat_id = %chat_id, tenant = %caller.tenant, %error, "deleting a chat failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the chat cannot be deleted right now; nothing was deleted",
        )
    })?;
    if !deleted {
        return Err(ApiError::not_found());
    }
    Ok(HttpResponse::NoContent().finish())
}

/// In a cluster, stops the caller's chat `chat_id` on the node that runs it, before this node
/// deletes it from the store. Best effort: the deletion also deletes the chat's lease, so a
/// node that missed this (unreachable, paused) has every later write of the chat fenced.
async fn stop_on_its_node(state: &AppState, caller: &Caller, chat_id: &str) {
    let Some(cluster) = &state.cluster else {
        return;
    };
    let local = state
        .registry
        .send(FindChat {
            chat_id: chat_id.to_owned(),
            tenant: caller.tenant.clone(),
            user: caller.user.clone(),
        })
        .await
        .ok()
        .flatten();
    if local.is_some() {
        return;
    }
    // Only the caller's own open chat: the store says whose it is.
    let open_and_owned = state
        .chats
        .load_chat(chat_id)
        .await
        .ok()
        .flatten()
        .is_some_and(|c| {
            *c.record.tenant == *caller.tenant
                && *c.record.user_id == *caller.user
                && c.state.status != tessera_store::STATUS_COMPLETED
        });
    if !open_and_owned {
        return;
    }
    let remote = RemoteChat::new(
        std::sync::Arc::from(chat_id),
        cluster.bus.clone(),
        state.chats.clone(),
        cluster.node.clone(),
        Duration::ZERO,
    );
    if let Err(e) = remote.send(ChatCommand::Stop).await {
        tracing::info!(chat_id, error = ?e, "the chat's node did not stop it; deleting fences it");
    }
}

async fn cancel_chat(OwnedChat { chat, .. }: OwnedChat) -> Result<HttpResponse, ApiError> {
    match chat {
        ChatLink::Local(chat) => chat.addr.send(CancelRun).await.map_err(|_| unavailable())?,
        ChatLink::Remote(remote) => {
            forward(&remote, ChatCommand::Cancel).await?;
        }
    }
    Ok(HttpResponse::Accepted().json(json!({"status": "cancelling"})))
}

/// Parses a REST body as the data of a client frame of type `kind`: one parser and one set of
/// error codes for both transports.
pub(crate) fn parse_body(
    kind: &str,
    body: Value,
) -> Result<tessera_protocol::ClientMessage, ApiError> {
    let frame = json!({"type": kind, "data": body}).to_string();
    tessera_protocol::parse_client_frame(&frame)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code().as_str(), e.to_string()))
}

async fn post_input(
    OwnedChat { chat, caller }: OwnedChat,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    spend_input_budget(&state, &caller).await?;
    let message = parse_body("chat.user_message", body.into_inner())?;
    let tessera_protocol::ClientMessage::UserMessage {
        content,
        client_msg_id,
    } = message
    else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidField.as_str(),
            "body must be {content, client_msg_id?}",
        ));
    };
    match chat {
        ChatLink::Local(chat) => {
            let input = UserInput {
                content,
                client_msg_id,
            };
            crate::telemetry::send_input(&chat.addr, input, crate::telemetry::remote_parent(&req))
                .await
                .map_err(|_| unavailable())??;
        }
        ChatLink::Remote(remote) => {
            let command = ChatCommand::Input {
                content,
                client_msg_id,
            };
            forward(&remote, command).await?;
        }
    }
    Ok(HttpResponse::Accepted().json(json!({"status": "accepted"})))
}

async fn post_tool_response(
    OwnedChat { chat, caller }: OwnedChat,
    state: web::Data<AppState>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    spend_input_budget(&state, &caller).await?;
    let tessera_protocol::ClientMessage::ToolResponse(frame) =
        parse_body("chat.tool_response", body.into_inner())?
    else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidField.as_str(),
            "body must be {corr, status, action?, data?, message?, code?}",
        ));
    };
    match chat {
        ChatLink::Local(chat) => chat
            .addr
            .send(ToolAnswer {
                corr: frame.corr,
                response: frame.raw,
            })
            .await
            .map_err(|_| unavailable())??,
        ChatLink::Remote(remote) => {
            let command = ChatCommand::ToolAnswer {
                corr: frame.corr,
                response: frame.raw,
            };
            forward(&remote, command).await?;
        }
    }
    Ok(HttpResponse::Accepted().json(json!({"status": "accepted"})))
}

async fn download_file(
    OwnedChat { caller, chat }: OwnedChat,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, file) = path.into_inner();
    let found = state
        .artifacts
        .get(&caller.tenant, &caller.user, chat.chat_id(), &file)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    let Some(artifact) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such file",
        ));
    };
    let name: String = artifact
        .meta
        .file_name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    Ok(HttpResponse::Ok()
        .content_type("application/zip")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{name}\""),
        ))
        .body(artifact.bytes))
}

#[derive(Deserialize)]
struct WsQuery {
    #[serde(default)]
    last_seq: u64,
    /// A single-use ticket from `POST /api/v1/ws-ticket` (browsers without a header).
    #[serde(default)]
    ticket: Option<String>,
}

async fn websocket(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<WsQuery>,
    stream: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let caller = state
        .auth
        .ws_caller(&req, &path, query.ticket.as_deref())
        .await
        .map_err(caller_error)?;
    let mut chat = locate_chat(&state, &caller, &path).await?;
    // A socket is long-lived: its chat had rather run here than cross NATS for each event.
    // (The caller's right to the chat was checked above, from the store.) A chat that is
    // running stays with its owner; the socket asks again once the chat asks its user.
    if let ChatLink::Remote(remote) = &chat
        && let Some(here) = remote.claim_here().await
    {
        chat = ChatLink::Local(here);
    }
    crate::ws::upgrade(
        &req,
        stream,
        chat,
        query.last_seq,
        crate::ws::ConnectionShared {
            limits: state.limits.clone(),
            metrics: state.metrics.clone(),
            hub: state.connections.clone(),
            tenant_budget: state.tenant_budget.clone(),
            tenant: caller.tenant.clone(),
        },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketRequest {
    chat_id: String,
}

/// Issues a short-lived, single-use ticket for opening one chat's WebSocket, so a browser
/// never puts a long-lived credential in a URL.
async fn ws_ticket(
    caller: Caller,
    state: web::Data<AppState>,
    body: web::Json<TicketRequest>,
) -> Result<HttpResponse, ApiError> {
    let chat = locate_chat(&state, &caller, &body.chat_id).await?;
    let (ticket, ttl) = state
        .auth
        .issue_ticket(&caller, chat.chat_id())
        .await
        .map_err(caller_error)?;
    Ok(HttpResponse::Ok().json(json!({"ticket": ticket, "expires_in_s": ttl})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    workflow: String,
    message: String,
}

/// Runs a workflow without UI tools for one message and returns its answer
/// (`structured_tool_loop.md`'s `/chat` endpoint).
async fn run_workflow(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<RunRequest>,
) -> Result<HttpResponse, ApiError> {
    spend_input_budget(&state, &caller).await?;
    let body = body.into_inner();
    let chat = start_chat(&state, &caller, body.workflow, Map::new(), None).await?;
    let (done, result) = oneshot::channel();
    let collector = RunCollector {
        done: Some(done),
        started: false,
        texts: Vec::new(),
        tools: Vec::new(),
        usage: (0, 0),
    }
    .start();
    let subscription = chat
        .addr
        .send(Watch(collector.recipient()))
        .await
        .map_err(|_| unavailable())?;
    let input = UserInput {
        content: body.message,
        client_msg_id: None,
    };
    crate::telemetry::send_input(&chat.addr, input, crate::telemetry::remote_parent(&req))
        .await
        .map_err(|_| unavailable())??;
    let outcome = tokio::time::timeout(Duration::from_secs(300), result)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                "the run did not finish in 300 s",
            )
        })?
        .map_err(|_| unavailable())?;
    chat.addr.do_send(Unsubscribe(subscription));
    match outcome {
        RunOutcome::Done { response, tools_used, usage } => Ok(HttpResponse::Ok().json(json!({
            "chat_id": &*chat.identity.chat_id,
            "response": response,
            "tools_used": tools_used,
            "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1},
        }))),
        RunOutcome::Failed { code, message } => Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)),
    }
}

enum RunOutcome {
    Done {
        response: String,
        tools_used: Vec<Arc<str>>,
        usage: (u64, u64),
    },
    Failed {
        code: &'static str,
        message: String,
    },
}

/// Watches one chat's events until the run hands back to the user or ends.
struct RunCollector {
    done: Option<oneshot::Sender<RunOutcome>>,
    started: bool,
    texts: Vec<String>,
    tools: Vec<Arc<str>>,
    usage: (u64, u64),
}

impl RunCollector {
    fn finish(&mut self, outcome: RunOutcome, ctx: &mut Context<Self>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(outcome);
        }
        ctx.stop();
    }
}

impl Actor for RunCollector {
    type Context = Context<Self>;
}

impl Handler<Observed> for RunCollector {
    type Result = ();

    fn handle(&mut self, Observed(event, _): Observed, ctx: &mut Self::Context) {
        match event {
            ServerEvent::RunStart { .. } => self.started = true,
            ServerEvent::Text {
                role,
                content,
                ui_hidden,
                ..
            } if self.started && role == "assistant" && !ui_hidden => self.texts.push(content),
            ServerEvent::ToolCall(ToolCallEvent::AwaitingUi(_)) => self.finish(
                RunOutcome::Failed {
                    code: "ui_tool_required",
                    message: "this workflow needs a UI tool; use a WebSocket chat".into(),
                },
                ctx,
            ),
            ServerEvent::ToolCall(ToolCallEvent::Announced(call))
                if self.started && !self.tools.contains(&call.tool_name) =>
            {
                self.tools.push(call.tool_name);
            }
            ServerEvent::Usage {
                prompt_tokens,
                completion_tokens,
                ..
            } if self.started => {
                self.usage.0 += prompt_tokens;
                self.usage.1 += completion_tokens;
            }
            ServerEvent::Error { message, .. } if self.started => self.finish(
                RunOutcome::Failed {
                    code: "run_failed",
                    message,
                },
                ctx,
            ),
            ServerEvent::InputRequest { .. } | ServerEvent::RunComplete { .. } if self.started => {
                let response = self.texts.join("\n\n");
                let outcome = RunOutcome::Done {
                    response,
                    tools_used: std::mem::take(&mut self.tools),
                    usage: self.usage,
                };
                self.finish(outcome, ctx);
            }
            _ => {}
        }
    }
}
