//! MCP servers (`mcp.json`): which Model Context Protocol servers a workflow uses and which of
//! their tools each agent may call.
//!
//! ```json
//! {
//!   "servers": {
//!     "docs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],
//!              "env": {"API_KEY": "${env:DOCS_API_KEY}"}, "tool_prefix": "docs_", "timeout_s": 20},
//!     "crm":  {"url": "https://crm.example.com/mcp",
//!              "headers": {"Authorization": "Bearer ${env:CRM_TOKEN}"}}
//!   },
//!   "agents": {"Assistant": {"docs": ["echo"], "crm": ["find_customer"]}}
//! }
//! ```
//!
//! WHY secret references: header and env values are copied into logs, error messages and the
//! manifest's content hash; `${env:NAME}` keeps the secret itself in the process environment,
//! resolved only when the connection is made. A credential-looking header or variable with a
//! literal value is an error.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::error::Diag;
use crate::json::{Loc, Obj, did_you_mean, object, type_name};

/// How the engine reaches an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum McpTransport {
    /// A child process speaking MCP on stdin/stdout, started once per node.
    Stdio {
        /// The program (looked up on `PATH` when not a path).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment variables; values may hold `${env:NAME}` references.
        env: BTreeMap<String, String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// `http://` or `https://` URL of the MCP endpoint.
        url: String,
        /// Headers sent with every request; values may hold `${env:NAME}` references.
        headers: BTreeMap<String, String>,
    },
}

/// One declared MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    /// The key in `servers` (unique per workflow).
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// Put before each of its tool names in what the model sees (avoids clashes).
    pub tool_prefix: String,
    /// Timeout of one call in seconds (the engine's tool timeout when absent).
    pub timeout_s: Option<f64>,
}

/// The tools of one server an agent may call (an allow-list).
#[derive(Debug, Clone, PartialEq)]
pub struct McpGrant {
    /// The agent.
    pub agent: String,
    /// The server's name.
    pub server: String,
    /// The server's names of the allowed tools.
    pub tools: Vec<String>,
}

/// The parsed `mcp.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpDecls {
    /// Servers in name order.
    pub servers: Vec<McpServer>,
    /// Grants in agent, then server order.
    pub grants: Vec<McpGrant>,
}

impl McpDecls {
    /// The server named `name`.
    pub fn server(&self, name: &str) -> Option<&McpServer> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// What `agent` may call: each grant with its server.
    pub fn grants_of<'a>(
        &'a self,
        agent: &'a str,
    ) -> impl Iterator<Item = (&'a McpServer, &'a McpGrant)> + 'a {
        self.grants
            .iter()
            .filter(move |g| g.agent == agent)
            .filter_map(|g| self.server(&g.server).map(|s| (s, g)))
    }
}

/// The name the model calls a server's tool by.
pub fn mcp_exposed_name(server: &McpServer, tool: &str) -> String {
    format!("{}{tool}", server.tool_prefix)
}

/// Whether `name` is a function name every model API accepts (`^[A-Za-z0-9_-]{1,64}$`).
pub fn is_model_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

const FILE: &str = "mcp.json";
const SERVER_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "url",
    "headers",
    "tool_prefix",
    "timeout_s",
];

/// Parses `mcp.json`. `agents`: declared agents (`None` when agents.json is unreadable);
/// `functions`: the tools.json function names an exposed name must not clash with.
pub(crate) fn parse(
    doc: &Value,
    agents: Option<&BTreeSet<String>>,
    functions: &BTreeSet<String>,
    d: &mut Diag,
) -> McpDecls {
    let mut out = McpDecls::default();
    let root = Loc::root(FILE);
    let Some(top) = object(doc, &root, "the document", d) else {
        return out;
    };
    top.allow_keys(&["servers", "agents"], d);
    if let Some(v) = top.get("servers")
        && let Some(servers) = object(v, &root.key("servers"), "\"servers\"", d)
    {
        for (name, v) in servers.map {
            let loc = servers.loc.key(name);
            if !crate::json::is_ident(name) {
                loc.err(
                    d,
                    format!("server name \"{name}\" must be an identifier (letters, digits, _)"),
                );
            }
            if let Some(server) = parse_server(name, v, &loc, d) {
                out.servers.push(server);
            }
        }
    }
    let declared: BTreeSet<&str> = top
        .get("servers")
        .and_then(Value::as_object)
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if let Some(v) = top.get("agents")
        && let Some(by_agent) = object(v, &root.key("agents"), "\"agents\"", d)
    {
        for (agent, v) in by_agent.map {
            let loc = by_agent.loc.key(agent);
            if let Some(agents) = agents
                && !agents.contains(agent)
            {
                loc.err(
                    d,
                    format!(
                        "agent \"{agent}\" is not declared in agents.json{}; fix the name or add the agent",
                        did_you_mean(agent, agents.iter().map(String::as_str))
                    ),
                );
            }
            let Some(by_server) = object(v, &loc, "the agent's grants", d) else {
                continue;
            };
            let mut exposed: BTreeMap<String, String> = BTreeMap::new();
            for (server, v) in by_server.map {
                let sloc = loc.key(server);
                if !declared.contains(server.as_str()) {
                    sloc.err(
                        d,
                        format!(
                            "server \"{server}\" is not declared in \"servers\"{}; declare it or fix the name",
                            did_you_mean(server, declared.iter().copied())
                        ),
                    );
                    continue;
                }
                let tools = tool_list(v, &sloc, d);
                if let Some(s) = out.server(server) {
                    for (i, tool) in &tools {
                        let name = mcp_exposed_name(s, tool);
                        let tloc = sloc.idx(*i);
                        if !is_model_tool_name(&name) {
                            tloc.err(d, format!("tool name \"{name}\" is not a valid model function name (1-64 of A-Z a-z 0-9 _ -); change \"tool_prefix\""));
                        } else if functions.contains(&name) {
                            tloc.err(d, format!("tool \"{name}\" clashes with a tools.json function; set a \"tool_prefix\" on server \"{server}\""));
                        } else if let Some(other) = exposed.insert(name.clone(), server.clone()) {
                            tloc.err(d, format!("tool \"{name}\" is granted twice to \"{agent}\" (also from server \"{other}\"); set a \"tool_prefix\""));
                        }
                    }
                }
                out.grants.push(McpGrant {
                    agent: agent.clone(),
                    server: server.clone(),
                    tools: tools.into_iter().map(|(_, t)| t).collect(),
                });
            }
        }
    }
    out
}

fn tool_list(v: &Value, loc: &Loc, d: &mut Diag) -> Vec<(usize, String)> {
    let Value::Array(items) = v else {
        loc.err(
            d,
            format!(
                "expected the allowed tool names (a JSON array of strings), found {}",
                type_name(v)
            ),
        );
        return Vec::new();
    };
    if items.is_empty() {
        loc.err(
            d,
            "the allow-list is empty; list the tools the agent may call or remove the server",
        );
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(t) if !t.trim().is_empty() => {
                if seen.insert(t) {
                    out.push((i, t.to_owned()));
                } else {
                    loc.idx(i)
                        .err(d, format!("tool \"{t}\" is listed twice; remove one"));
                }
            }
            _ => loc.idx(i).err(
                d,
                format!(
                    "each allowed tool must be a non-empty string, found {}",
                    type_name(item)
                ),
            ),
        }
    }
    out
}

fn parse_server(name: &str, v: &Value, loc: &Loc, d: &mut Diag) -> Option<McpServer> {
    let o = object(v, loc, "a server definition", d)?;
    o.allow_keys(SERVER_KEYS, d);
    let command = o.opt_str("command", d);
    let url = o.opt_str("url", d);
    let tool_prefix = o.opt_str("tool_prefix", d).unwrap_or_default().to_owned();
    let timeout_s = o.opt_positive("timeout_s", d);
    let transport = match (command, url) {
        (Some(command), None) => {
            if o.get("headers").is_some() {
                loc.key("headers").err(
                    d,
                    "\"headers\" belong to an HTTP server (\"url\"); a stdio server takes \"env\"",
                );
            }
            if command.trim().is_empty() {
                loc.key("command").err(d, "\"command\" must not be empty");
            }
            McpTransport::Stdio {
                command: command.to_owned(),
                args: o
                    .opt_str_list("args", d)
                    .into_iter()
                    .map(|(_, a)| a.to_owned())
                    .collect(),
                env: string_map(&o, "env", d),
            }
        }
        (None, Some(url)) => {
            for key in ["args", "env"] {
                if o.get(key).is_some() {
                    loc.key(key).err(d, format!("\"{key}\" belongs to a stdio server (\"command\"); an HTTP server takes \"headers\""));
                }
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                loc.key("url").err(
                    d,
                    format!("\"url\" must start with http:// or https://, found \"{url}\""),
                );
            }
            McpTransport::Http {
                url: url.to_owned(),
                headers: string_map(&o, "headers", d),
            }
        }
        (Some(_), Some(_)) => {
            loc.err(
                d,
                format!(
                    "server \"{name}\" has both \"command\" (stdio) and \"url\" (HTTP); keep one"
                ),
            );
            return None;
        }
        (None, None) => {
            loc.err(d, format!("server \"{name}\" needs \"command\" (a stdio server) or \"url\" (a Streamable HTTP server)"));
            return None;
        }
    };
    Some(McpServer {
        name: name.to_owned(),
        transport,
        tool_prefix,
        timeout_s,
    })
}

/// A `{name: string}` object whose values may hold `${env:NAME}` references; a
/// credential-looking entry must use one.
fn string_map(o: &Obj<'_>, key: &str, d: &mut Diag) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(v) = o.get(key) else {
        return out;
    };
    let loc = o.loc.key(key);
    let Some(map) = object(v, &loc, &format!("\"{key}\""), d) else {
        return out;
    };
    for (name, value) in map.map {
        let vloc = loc.key(name);
        let Some(value) = value.as_str() else {
            vloc.err(
                d,
                format!("\"{name}\" must be a string, found {}", type_name(value)),
            );
            continue;
        };
        if let Err(problem) = check_references(value) {
            vloc.err(d, problem);
        } else if looks_like_credential(name) && !value.contains("${env:") {
            vloc.err(d, format!("\"{name}\" looks like a credential but holds a literal value; reference it from the environment, e.g. \"${{env:{}}}\"", name.to_ascii_uppercase().replace('-', "_")));
        }
        out.insert(name.clone(), value.to_owned());
    }
    out
}

fn looks_like_credential(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [
        "authorization",
        "token",
        "secret",
        "password",
        "key",
        "cookie",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// Every `${...}` in `value` must be `${env:NAME}` with a valid variable name.
fn check_references(value: &str) -> Result<(), String> {
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("unterminated \"${\"; write ${env:NAME}".to_owned());
        };
        let inner = &after[..end];
        match inner.strip_prefix("env:") {
            Some(var) if crate::json::is_ident(var) => {}
            _ => {
                return Err(format!(
                    "\"${{{inner}}}\" is not a secret reference; write ${{env:NAME}}"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_doc(doc: Value) -> (McpDecls, Vec<String>) {
        let mut d = Diag::new("Wf");
        let agents = BTreeSet::from(["Assistant".to_owned()]);
        let functions = BTreeSet::from(["lookup".to_owned()]);
        let decls = parse(&doc, Some(&agents), &functions, &mut d);
        let errors = d.into_errors().iter().map(ToString::to_string).collect();
        (decls, errors)
    }

    #[test]
    fn servers_and_grants_are_read() {
        let (decls, errors) = parse_doc(json!({
            "servers": {
                "local": {"command": "srv", "args": ["--stdio"], "env": {"API_KEY": "${env:LOCAL_KEY}"}, "tool_prefix": "local_", "timeout_s": 5},
                "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${env:TOKEN}"}}
            },
            "agents": {"Assistant": {"local": ["echo"], "remote": ["lookup_customer"]}}
        }));
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(decls.servers.len(), 2);
        let local = decls.server("local").map(|s| mcp_exposed_name(s, "echo"));
        assert_eq!(local.as_deref(), Some("local_echo"));
        let grants: Vec<_> = decls
            .grants_of("Assistant")
            .map(|(s, g)| (s.name.as_str(), g.tools.clone()))
            .collect();
        assert_eq!(
            grants,
            [
                ("local", vec!["echo".to_owned()]),
                ("remote", vec!["lookup_customer".to_owned()])
            ]
        );
    }

    #[test]
    fn mistakes_are_reported_with_their_paths() {
        let (_, errors) = parse_doc(json!({
            "servers": {
                "both": {"command": "x", "url": "http://x"},
                "remote": {"url": "ftp://x", "headers": {"Authorization": "Bearer sk-live-123"}},
                "plain": {"command": "srv", "env": {"MODE": "${vault:x}"}}
            },
            "agents": {
                "Assistent": {"plain": ["a"]},
                "Assistant": {"plain": ["lookup", "lookup"], "missing": ["a"], "remote": []}
            }
        }));
        let expect = [
            "Wf/mcp.json /servers/both: server \"both\" has both",
            "Wf/mcp.json /servers/remote/url: \"url\" must start with http://",
            "Wf/mcp.json /servers/remote/headers/Authorization: \"Authorization\" looks like a credential",
            "Wf/mcp.json /servers/plain/env/MODE: \"${vault:x}\" is not a secret reference",
            "Wf/mcp.json /agents/Assistent: agent \"Assistent\" is not declared in agents.json (did you mean \"Assistant\"?)",
            "Wf/mcp.json /agents/Assistant/plain/1: tool \"lookup\" is listed twice",
            "Wf/mcp.json /agents/Assistant/plain/0: tool \"lookup\" clashes with a tools.json function",
            "Wf/mcp.json /agents/Assistant/missing: server \"missing\" is not declared",
            "Wf/mcp.json /agents/Assistant/remote: the allow-list is empty",
        ];
        for e in expect {
            assert!(
                errors.iter().any(|got| got.starts_with(e)),
                "missing {e:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    }
}
