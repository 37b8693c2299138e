// Package sdk holds the tests that drive the official OpenAI and
// Anthropic Go SDKs through drip serve's gateway, in front of the
// example's stand-in model server, with examples/llm/rules.yaml, on the
// memory store and on a PostgreSQL and a Redis server the tests start
// (initdb, postgres and redis-server from the machine). It is
// a module of its own, so that the SDKs stay out of drip's go.mod.
package sdk
