// Drives Tessera's AG-UI endpoint with the official client (`@ag-ui/client`'s HttpAgent, whose
// event verifier rejects out-of-order streams) through a CopilotKit-style round trip of UI
// tools: run 1 sends a user message and ends on an interrupt; run 2 resumes it with the
// component's answer and ends on the next interrupt; run 3, a fresh client on the same thread
// with nothing new to say, must be told the same pending interrupt.
// Usage: node round_trip.mjs <base url> <workflow> <user> <message> <answer json>
// Prints one JSON line: {runs: [{events, outcome, interrupts, state}]}.
import { HttpAgent } from "@ag-ui/client";

const [base, workflow, user, message, answer] = process.argv.slice(2);

const agent = new HttpAgent({
  url: `${base}/api/v1/agui/${workflow}`,
  headers: { "x-user-id": user },
  threadId: `thread-${Date.now()}`,
});

async function run(parameters) {
  const events = [];
  const result = await agent.runAgent(parameters, {
    onEvent: ({ event }) => {
      events.push(event);
    },
  });
  return {
    events,
    result: result.result ?? null,
    interrupts: agent.pendingInterrupts,
    state: agent.state,
    messages: agent.messages.length,
  };
}

const runs = [];
agent.addMessage({ id: "m-1", role: "user", content: message });
runs.push(await run({ runId: "run-1" }));
const first = agent.pendingInterrupts[0];
runs.push(
  await run({
    runId: "run-2",
    resume: [{ interruptId: first.id, status: "resolved", payload: JSON.parse(answer) }],
  }),
);
// A client that reconnects with nothing new learns the same pending interrupt.
const again = new HttpAgent({
  url: agent.url,
  headers: agent.headers,
  threadId: agent.threadId,
  initialMessages: agent.messages,
});
const events = [];
await again.runAgent(
  { runId: "run-3" },
  {
    onEvent: ({ event }) => {
      events.push(event);
    },
  },
);
runs.push({ events, interrupts: again.pendingInterrupts });
console.log(JSON.stringify({ runs }));
