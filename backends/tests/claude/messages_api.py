#!/usr/bin/env python3
"""A scripted local stand-in of the Anthropic Messages API, for driving the real Claude Code CLI.

Usage: messages_api.py SCRIPT.json LOG.jsonl
Prints the port it listens on (127.0.0.1) as its first line on stdout, then serves until killed.

SCRIPT: {"steps": [[{"name": TOOL, "input": {...}}, ...], ...], "final": TEXT}. Each request of the
agent loop (one that offers the Bash tool) gets the next step's tool_use blocks, streamed as
server-sent events when the request asks for a stream; after the last step it gets TEXT and
end_turn. Any other request (titles, summaries) gets a short text. Every request body is appended
to LOG, one JSON object a line, for the test to read the tool results Claude Code sent back.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCRIPT = json.load(open(sys.argv[1]))
LOG = sys.argv[2]
LOCK = threading.Lock()
STATE = {"step": 0, "ids": 0}


def next_reply(body):
    tools = [t.get("name") for t in body.get("tools") or []]
    with LOCK:
        if "Bash" not in tools:
            return [{"type": "text", "text": "ok"}], "end_turn"
        step = STATE["step"]
        STATE["step"] += 1
        if step >= len(SCRIPT["steps"]):
            return [{"type": "text", "text": SCRIPT.get("final", "done")}], "end_turn"
        blocks = []
        for call in SCRIPT["steps"][step]:
            STATE["ids"] += 1
            blocks.append({"type": "tool_use", "id": "toolu_%04d" % STATE["ids"],
                           "name": call["name"], "input": call["input"]})
        return blocks, "tool_use"


def sse(event, data):
    return ("event: %s\ndata: %s\n\n" % (event, json.dumps(data))).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})

    do_HEAD = do_GET

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with LOCK:
            with open(LOG, "a") as f:
                f.write(json.dumps({"path": self.path, "body": body}) + "\n")
        path = self.path.split("?")[0]
        if path.endswith("/count_tokens"):
            return self.reply_json(200, {"input_tokens": 10})
        if not path.endswith("/v1/messages"):
            return self.do_GET()
        blocks, stop = next_reply(body)
        model = body.get("model", "claude-sonnet-4-5")
        usage = {"input_tokens": 10, "output_tokens": 10,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": "msg_%d" % STATE["ids"], "type": "message", "role": "assistant",
                   "model": model, "content": blocks, "stop_reason": stop,
                   "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return self.reply_json(200, message)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        out = [sse("message_start", {"type": "message_start",
                                     "message": dict(message, content=[], stop_reason=None)})]
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                out.append(sse("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                start = dict(block, input={})
                out.append(sse("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": start}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": json.dumps(block["input"])}}))
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": 10}}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.wfile.write(b"".join(out))
        self.wfile.flush()
        self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
