// Package runner holds the Python tool runner (runner.py, a small entry
// point embedded as Source, and _str_runner.py, the runner itself, embedded
// as ModuleSource) and the Go side of its file protocol: runner_args.json
// written by the worker (WriteArgs, spec §7.3) and result.json written by
// the runner (ReadResult, spec §7.5). Install places both files read-only
// where the sandbox can see them; Compile writes the module's bytecode
// cache (a checked-hash .pyc, used only while it matches the source) so
// that a cold call does not compile the runner (about 5 ms of CPU).
//
// Start-up cost is part of the design: every call starts a fresh Python,
// so the runner imports almost nothing (no inspect, json, re, threading,
// traceback or asyncio unless a call needs them) and reads the calling
// convention from the function's code object; see the module docstring.
//
// runner.py runs inside the sandbox as the tool's own process: it imports
// the tool module, builds the ctx object of spec §8, calls the tool with
// the calling convention of spec §8 (every generation of the reference's
// tools: plain functions, functions taking ctx, class-based DynamicTool
// subclasses, portable tools with Artifact parameters and a ToolResult
// return value, whose data objects it writes into the output directory),
// normalises the return value (spec §3) and writes result.json atomically
// with an error kind ("import", "execution" or "tool") so the worker can
// pick IMPORT_ERROR, EXECUTION_ERROR or TOOL_ERROR. In ModeInit it
// describes the tool instead (InitInfo, spec §14). Tools that import the
// reference's own types get stand-ins when its package is not installed. Status lines go through the FIFO named in
// status_pipe, one open/write/close per line ({"status": "..."}\n). With
// --done-fd N it writes "d" on that pipe once result.json is in place (the
// worker replies then, before the sandbox is gone); with --warm (the
// worker's pool) it imports the tool first, writes "r", and reads the
// runner arguments (EncodeArgs) from a pipe instead of a file. With
// --template CTRL_FD (launcher/template) it imports the tool once and
// forks each call on the supervisor's order; the child sets itself up as
// the supervisor says, receives the same runner arguments on its call's
// socket, runs them exactly as a cold run does (_run) and answers the
// result document there.
//
// What it protects against: nothing inside the sandbox. The runner shares
// its process with the tool, so a tool can rewrite the runner's state,
// write any result file it likes, or skip the runner's checks
// (save_artifact's filename checks only protect honest tools from
// mistakes). Everything the runner produces is therefore read by the
// worker as untrusted input: ReadResult refuses symlinks and non-regular
// files (opened O_NOFOLLOW|O_NONBLOCK, so a FIFO in place of result.json
// cannot hang the worker), enforces a size limit, and accepts only the two
// documented shapes with a known error kind.
//
// What it does not do: it does not sandbox anything (the launcher does),
// does not enforce time or memory limits (the sandbox's rlimits and the
// worker's wall-clock timeout do), and does not validate the tool's
// arguments against a schema.
//
// What it trusts: the worker to write runner_args.json before the sandbox
// starts and to open the FIFO's read end before the tool runs; python3
// (3.9 or newer) inside the sandbox. Kernel features: none beyond FIFOs.
package runner
