// What the dashboard's browser tests (tests/browser/test_*.mjs) share:
// the argument check, the pass/fail report ("RESULT: N passed, M failed"),
// daemons started on loopback in temporary state directories and stopped
// at the end with a check that each exits cleanly on SIGTERM (no
// sanitizer report: the ASan build runs these tests too), a bounded wait,
// and a hard stop for the whole run.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/* Reads TRAINERD and ARTIFACT_DIR from the command line and returns the
 * run: check, step, startDaemon, finish, and `browser` (set it, and
 * finish closes it).  The run ends with exit 1 after limitMs. */
export function browserTest(name, limitMs) {
	const [trainerd, artifacts] = process.argv.slice(2);
	if (!trainerd || !artifacts) {
		console.error(`usage: ${name}.mjs TRAINERD ARTIFACT_DIR`);
		process.exit(2);
	}
	fs.mkdirSync(artifacts, { recursive: true });
	let passed = 0, failed = 0;
	const daemons = [];
	const t = { trainerd, artifacts, browser: null };
	const hardStop = setTimeout(() => {
		console.error(`${name}: took over ${limitMs / 1000} s; giving up`);
		t.finish(1);
	}, limitMs);

	t.check = (what, ok, detail) => {
		if (ok) passed++;
		else failed++;
		console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${!ok && detail ? ': ' + detail : ''}`);
	};
	/* One named check: passes unless fn throws; the error's first line is the detail. */
	t.step = async (what, fn) => {
		try {
			await fn();
			t.check(what, true);
		} catch (e) {
			t.check(what, false, e && e.message ? e.message.split('\n')[0] : String(e));
		}
	};
	/* A daemon on 127.0.0.1 with `devices` CPU devices and extra arguments;
	 * resolves once it has written its address ({proc, dir, log, url}). */
	t.startDaemon = async (devices, extra) => {
		const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'trainerd-browser-'));
		const log = path.join(artifacts, `daemon-${daemons.length}.log`);
		const proc = spawn(trainerd, ['serve', '--listen', '127.0.0.1:0', '--state-dir', dir, '--data-root', dir,
			'--cpu-devices', String(devices), '--backend', 'cpu', '--openapi', '', ...(extra || [])],
		{ stdio: ['ignore', 'ignore', fs.openSync(log, 'w')] });
		const d = { proc, dir, log, url: null };
		d.exit = new Promise((r) => proc.on('exit', (c, sig) => r({ code: c, signal: sig })));
		daemons.push(d);
		for (let i = 0; i < 100 && !d.url; i++) {
			await new Promise((r) => setTimeout(r, 100));
			try {
				const addr = fs.readFileSync(path.join(dir, 'listen.addr'), 'utf8').trim();
				d.url = addr.startsWith('http') ? addr : 'http://' + addr;
			} catch (e) { /* not yet */ }
		}
		if (!d.url) throw new Error('trainerd did not start (see daemon log in ' + artifacts + ')');
		return d;
	};
	/* Closes the browser, stops every daemon (checking each exits
	 * cleanly unless code is given: the run is being cut short), prints
	 * the result and exits: code, else 1 if any check failed. */
	t.finish = async (code) => {
		clearTimeout(hardStop);
		if (t.browser) await t.browser.close().catch(() => {});
		for (const d of daemons) {
			try { d.proc.kill('SIGTERM'); } catch (e) { /* already gone */ }
			const how = await Promise.race([d.exit, new Promise((r) => setTimeout(() => r(null), 20000))]);
			try { d.proc.kill('SIGKILL'); } catch (e) { /* already gone */ }
			const report = /ERROR: \w+Sanitizer|runtime error:/.exec(fs.readFileSync(d.log, 'utf8'));
			if (code === undefined)
				t.check('daemon ' + path.basename(d.log) + ' exits cleanly on SIGTERM', how && how.code === 0 && !report,
					how ? 'exit ' + how.code + ' signal ' + how.signal + (report ? ', ' + report[0] + ' in its log' : '') : 'still running after 20 s');
			fs.rmSync(d.dir, { recursive: true, force: true });
		}
		console.log(`RESULT: ${passed} passed, ${failed} failed`);
		process.exit(code === undefined ? (failed ? 1 : 0) : code);
	};
	return t;
}

/* Polls fn (a promise of true when done) every 200 ms for timeoutMs. */
export async function waitFor(what, fn, timeoutMs) {
	const end = Date.now() + timeoutMs;
	while (Date.now() < end) {
		if ((await fn().catch(() => false)) === true) return;
		await new Promise((r) => setTimeout(r, 200));
	}
	throw new Error('timed out waiting for ' + what);
}
