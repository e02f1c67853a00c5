//! An agent's tool-calling loop, with a scripted stand-in for the model.
//!
//! The "model" sees the tool schema and the transcript, and answers either with a tool call
//! or with a final answer. Each tool call becomes one sandbox call; its result (exit code,
//! stdout, stderr, or the SBX error code and hint) goes back into the transcript, so the
//! next turn can use it. Swap `ScriptedModel` for a real LLM client and nothing else changes.
//!
//! ```text
//! cargo run -p sandbox-rs --example agent_loop --features fake
//! cargo run -p sandbox-rs --example agent_loop --features fake -- docker://sandbox-rs/python:3.11
//! SBX_EXAMPLE_DSN=docker://sandbox-rs/python:3.11 cargo run -p sandbox-rs --example agent_loop
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use sandbox::{CodeOptions, CreateOptions, RunOptions, Sandbox, SandboxError};

/// What an LLM would be given to fill tool calls (JSON Schema, as in any tool-use API).
const TOOL_SCHEMA: &str = r#"[
  {"name": "run_command", "description": "Run a shell command in the sandbox (sh -c)",
   "input_schema": {"type": "object", "required": ["command"],
                    "properties": {"command": {"type": "string"}}}},
  {"name": "run_python", "description": "Run Python code; `context` keeps variables between calls",
   "input_schema": {"type": "object", "required": ["code"],
                    "properties": {"code": {"type": "string"}, "context": {"type": "string"}}}},
  {"name": "write_file", "description": "Write a text file (relative paths are under /work)",
   "input_schema": {"type": "object", "required": ["path", "content"],
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}
]"#;

/// One tool call, as a model would emit it (already parsed from its JSON arguments).
#[derive(Debug, Clone)]
enum ToolCall {
    RunCommand {
        command: String,
    },
    RunPython {
        code: String,
        context: Option<String>,
    },
    WriteFile {
        path: String,
        content: String,
    },
}

/// What the model answers on one turn.
#[derive(Debug)]
enum ModelTurn {
    Call(ToolCall),
    Final(String),
}

/// A transcript entry: what the model asked and what the tool returned.
#[derive(Debug)]
struct Observation {
    call: ToolCall,
    result: String,
}

/// The scripted stand-in for the model. It decides from the transcript, like a model
/// would: the final answer quotes the last observation, so the loop really feeds results
/// back (a loop that dropped them would produce a wrong answer).
struct ScriptedModel;

impl ScriptedModel {
    fn next_turn(&self, _schema: &str, transcript: &[Observation]) -> ModelTurn {
        match transcript.len() {
            0 => ModelTurn::Call(ToolCall::WriteFile {
                path: "numbers.txt".into(),
                content: "19\n23\n".into(),
            }),
            1 => ModelTurn::Call(ToolCall::RunCommand {
                command: "cat numbers.txt".into(),
            }),
            // A failing tool call: the model sees the non-zero exit and recovers.
            2 => ModelTurn::Call(ToolCall::RunCommand {
                command: "cat missing.txt".into(),
            }),
            // The numbers come from what `cat` returned on turn 2, not from the script.
            3 => ModelTurn::Call(ToolCall::RunPython {
                code: format!(
                    "total = {}",
                    numbers_seen(transcript).first().copied().unwrap_or(0)
                ),
                context: Some("agent".into()),
            }),
            4 => ModelTurn::Call(ToolCall::RunPython {
                code: format!(
                    "print(total + {})",
                    numbers_seen(transcript).get(1).copied().unwrap_or(0)
                ),
                context: Some("agent".into()),
            }),
            _ => {
                let last = transcript.last().map(|o| o.result.as_str()).unwrap_or("");
                let answer = last
                    .lines()
                    .find_map(|l| l.strip_prefix("stdout: "))
                    .unwrap_or("unknown")
                    .trim()
                    .to_string();
                let n = numbers_seen(transcript);
                let (a, b) = (
                    n.first().copied().unwrap_or(0),
                    n.get(1).copied().unwrap_or(0),
                );
                ModelTurn::Final(format!("{a} + {b} = {answer}"))
            }
        }
    }
}

/// The integers the model saw when it read `numbers.txt`.
fn numbers_seen(transcript: &[Observation]) -> Vec<i64> {
    let Some(obs) = transcript.iter().find(
        |o| matches!(&o.call, ToolCall::RunCommand { command } if command == "cat numbers.txt"),
    ) else {
        return Vec::new();
    };
    // The tool result is "exit_code: …\nstdout: …\nstderr: …": take the stdout part.
    let stdout = obs
        .result
        .split_once("stdout: ")
        .map(|(_, rest)| rest.split("stderr:").next().unwrap_or(""))
        .unwrap_or("");
    stdout
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Executes one tool call in the sandbox. Sandbox errors become tool results (with the
/// stable SBX code and the fix) instead of ending the loop: the model decides what next.
async fn call_tool(sb: &dyn Sandbox, call: &ToolCall) -> String {
    let timeout = Duration::from_secs(30);
    let outcome = match call {
        ToolCall::RunCommand { command } => {
            sb.run(
                command.as_str().into(),
                RunOptions::default().timeout(timeout),
            )
            .await
        }
        ToolCall::RunPython { code, context } => {
            let mut opts = CodeOptions::default().timeout(timeout);
            if let Some(c) = context {
                opts = opts.context(c.clone());
            }
            sb.run_code(code, opts).await
        }
        ToolCall::WriteFile { path, content } => {
            let written = match sb.files() {
                Ok(fs) => fs.write(path, Bytes::from(content.clone())).await,
                Err(e) => Err(e),
            };
            return match written {
                Ok(()) => format!("ok: wrote {} bytes to {path}", content.len()),
                Err(e) => tool_error(&e),
            };
        }
    };
    match outcome {
        Ok(r) => format!(
            "exit_code: {}\nstdout: {}\nstderr: {}",
            r.exit_code,
            r.stdout_text().trim_end(),
            r.stderr_text().trim_end()
        ),
        Err(e) => tool_error(&e),
    }
}

fn tool_error(e: &SandboxError) -> String {
    format!("error: {} {e}\nhint: {}", e.code(), e.hint())
}

async fn agent(sb: &dyn Sandbox, model: &ScriptedModel) -> Result<String, Box<dyn Error>> {
    const MAX_TURNS: usize = 10;
    let mut transcript: Vec<Observation> = Vec::new();
    for turn in 1..=MAX_TURNS {
        match model.next_turn(TOOL_SCHEMA, &transcript) {
            ModelTurn::Final(answer) => {
                println!("turn {turn}: final answer: {answer}");
                return Ok(answer);
            }
            ModelTurn::Call(call) => {
                println!("turn {turn}: tool call {call:?}");
                let result = call_tool(sb, &call).await;
                println!("  -> {}", result.replace('\n', "\n     "));
                transcript.push(Observation { call, result });
            }
        }
    }
    Err(format!("no final answer after {MAX_TURNS} turns").into())
}

async fn run(dsn: &str) -> Result<(), Box<dyn Error>> {
    println!("tools offered to the model:\n{TOOL_SCHEMA}");
    let sb = sandbox::create(
        dsn,
        CreateOptions::default().timeout(Duration::from_secs(120)),
    )
    .await?;
    println!(
        "sandbox {} on {} ({:?})",
        sb.id(),
        sb.backend(),
        sb.isolation()
    );
    // Kill whatever the agent did, then report the agent's outcome first.
    let outcome = agent(&*sb, &ScriptedModel).await;
    let killed = sb.kill().await;
    let answer = outcome?;
    killed?;
    if answer != "19 + 23 = 42" {
        return Err(format!("unexpected final answer: {answer}").into());
    }
    println!("ok: {answer}");
    Ok(())
}

fn dsn() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("SBX_EXAMPLE_DSN").ok())
        .unwrap_or_else(|| "fake://".to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(&dsn()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<SandboxError>() {
                Some(se) => eprintln!("error [{}]: {se}\nhint: {}", se.code(), se.hint()),
                None => eprintln!("error: {e}"),
            }
            ExitCode::FAILURE
        }
    }
}
