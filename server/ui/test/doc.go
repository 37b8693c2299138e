// Package test drives drip serve's admin page in a real browser
// (Chromium, through chromedp), in a module of its own so that chromedp
// stays out of drip's go.mod.
package test
