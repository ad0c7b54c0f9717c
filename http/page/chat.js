/*
 * chat.js - zinfer's chat page (docs/http.md, "Chat page"). Lists the
 * served models (GET /v1/models), sends the conversation to
 * POST /v1/chat/completions with stream: true and reads the Server-Sent
 * Events as they arrive: content, reasoning_content (shown in a
 * collapsible block) and tool_calls deltas. A failed request shows the
 * API's own error message. Plain browser JavaScript with no outside code
 * and no build step; the server embeds this file as it is.
 *
 * Text from the model or the server only ever goes into the page as text
 * (textContent), never as HTML.
 */
'use strict';

(function () {
    const $ = (id) => document.getElementById(id);
    const els = {
        model: $('model'), key: $('api-key'), newChat: $('new-chat'), system: $('system'),
        temperature: $('temperature'), topP: $('top-p'), maxTokens: $('max-tokens'),
        extra: $('extra'), messages: $('messages'), error: $('error'), form: $('composer'),
        input: $('input'), send: $('send'), stop: $('stop'),
    };
    /* The settings kept across reloads (in this browser's localStorage). */
    const STORE = 'zinfer-chat-settings';
    const KEPT = ['key', 'system', 'temperature', 'topP', 'maxTokens', 'extra'];
    const state = {
        history: [],       /* the turns sent with the next request ({role, content, ...}) */
        controller: null,  /* the AbortController of the request in flight */
        answers: 0,        /* answers ended (finished, stopped or failed): for tests */
        savedModel: '',
    };

    function loadSettings() {
        let s = {};
        try {
            s = JSON.parse(localStorage.getItem(STORE) || '{}') || {};
        } catch (e) {
            s = {};
        }
        for (const k of KEPT)
            if (typeof s[k] === 'string') els[k].value = s[k];
        if (typeof s.model === 'string') state.savedModel = s.model;
    }

    function saveSettings() {
        const s = {model: els.model.value};
        for (const k of KEPT) s[k] = els[k].value;
        try {
            localStorage.setItem(STORE, JSON.stringify(s));
        } catch (e) {
            /* storage may be off (private windows): the page works without it */
        }
    }

    function headers() {
        const h = {'Content-Type': 'application/json'};
        const key = els.key.value.trim();
        if (key) h.Authorization = 'Bearer ' + key;
        return h;
    }

    function showError(text) {
        els.error.textContent = text;
        els.error.hidden = false;
    }

    function clearError() {
        els.error.textContent = '';
        els.error.hidden = true;
    }

    /* A failed answer in the API's words: its JSON error's message
     * (OpenAI's {"error": {"message"}}), else the body as text. */
    async function apiError(res) {
        let text = '';
        try {
            text = await res.text();
        } catch (e) {
            text = '';
        }
        let msg = text.trim();
        try {
            const o = JSON.parse(text);
            if (o && o.error && typeof o.error.message === 'string') msg = o.error.message;
        } catch (e) {
            /* not JSON: the text itself */
        }
        return `Error ${res.status}: ${msg || res.statusText}`;
    }

    function setBusy(busy) {
        els.send.disabled = busy;
        els.stop.disabled = !busy;
        document.body.dataset.state = busy ? 'busy' : 'idle';
    }

    function answerEnded() {
        state.answers += 1;
        document.body.dataset.answers = String(state.answers);
    }

    async function loadModels() {
        let res;
        try {
            res = await fetch('/v1/models', {headers: headers()});
        } catch (e) {
            showError('Cannot reach the server: ' + e.message);
            return;
        }
        if (!res.ok) {
            showError(await apiError(res));
            return;
        }
        const body = await res.json();
        const keep = els.model.value || state.savedModel;
        els.model.replaceChildren();
        for (const m of (body && body.data) || []) {
            const o = document.createElement('option');
            o.value = o.textContent = m.id;
            els.model.append(o);
        }
        if (keep && Array.from(els.model.options).some((o) => o.value === keep))
            els.model.value = keep;
        document.body.dataset.models = String(els.model.options.length);
        clearError();
    }

    function scrollDown() {
        els.messages.scrollTop = els.messages.scrollHeight;
    }

    function element(tag, cls, text) {
        const e = document.createElement(tag);
        if (cls) e.className = cls;
        if (text !== undefined) e.textContent = text;
        return e;
    }

    function addUser(text) {
        const div = element('div', 'msg user');
        div.append(element('div', 'role', 'you'), element('div', 'content', text));
        els.messages.append(div);
        scrollDown();
        return div;
    }

    /* An assistant's message as it streams: its reasoning (a <details>,
     * hidden until some arrives), content, tool calls and a line of facts. */
    function addAssistant() {
        const v = {div: element('div', 'msg assistant')};
        v.reasoning = element('details', 'reasoning');
        v.reasoning.hidden = true;
        v.reasoning.open = true;
        v.reasoning.append(element('summary', '', 'Reasoning'));
        v.reasoningText = element('div', 'reasoning-text');
        v.reasoning.append(v.reasoningText);
        v.content = element('div', 'content');
        v.calls = element('div', 'tool-calls');
        v.meta = element('div', 'meta');
        v.div.append(element('div', 'role', 'assistant'), v.reasoning, v.content, v.calls, v.meta);
        els.messages.append(v.div);
        scrollDown();
        return v;
    }

    function renderCalls(v, calls) {
        v.calls.replaceChildren();
        for (const c of calls) {
            if (!c) continue;
            const d = element('div', 'tool-call');
            d.append(element('span', 'label', 'tool call'), ' ',
                     element('span', 'name', c.function.name), element('code', 'arguments',
                                                                    c.function.arguments));
            if (c.id) d.title = 'id ' + c.id;
            v.calls.append(d);
        }
    }

    /* The number in a settings field, or undefined (then not sent) when
     * it is empty; a value the API refuses is its to say. */
    function fieldNumber(el) {
        const s = el.value.trim();
        return s === '' ? undefined : Number(s);
    }

    /* One chunk of the stream applied to the view v and the answer a. */
    function applyChunk(chunk, v, a) {
        if (chunk.usage) a.usage = chunk.usage;
        const ch = (chunk.choices || []).find((c) => c.index === 0 || c.index === undefined);
        if (!ch) return;
        const d = ch.delta || {};
        if (typeof d.reasoning_content === 'string' && d.reasoning_content) {
            a.reasoning += d.reasoning_content;
            v.reasoning.hidden = false;
            v.reasoningText.textContent = a.reasoning;
        }
        if (typeof d.content === 'string' && d.content) {
            if (!a.content && a.reasoning) v.reasoning.open = false; /* the answer began */
            a.content += d.content;
            v.content.textContent = a.content;
        }
        if (Array.isArray(d.tool_calls)) {
            for (const t of d.tool_calls) {
                const i = typeof t.index === 'number' ? t.index : a.calls.length;
                const c = a.calls[i] ||
                          (a.calls[i] = {id: '', type: 'function', function: {name: '', arguments: ''}});
                if (t.id) c.id = t.id;
                if (t.function && typeof t.function.name === 'string') c.function.name += t.function.name;
                if (t.function && typeof t.function.arguments === 'string')
                    c.function.arguments += t.function.arguments;
            }
            renderCalls(v, a.calls);
        }
        if (ch.finish_reason) a.finish = ch.finish_reason;
    }

    /* Reads the SSE body of res into the view: resolves when the stream
     * ends ([DONE] or its close); an error event is shown and ends it. */
    async function readStream(res, v, a) {
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        const boundary = /\r\n\r\n|\n\n|\r\r/;
        for (;;) {
            const {value, done} = await reader.read();
            if (done) break;
            buf += dec.decode(value, {stream: true});
            let m;
            while ((m = boundary.exec(buf))) {
                const block = buf.slice(0, m.index);
                buf = buf.slice(m.index + m[0].length);
                const data = block.split(/\r\n|\n|\r/)
                    .filter((l) => l.startsWith('data:'))
                    .map((l) => l.slice(l.startsWith('data: ') ? 6 : 5))
                    .join('\n');
                if (!data) continue;
                if (data === '[DONE]') return;
                const chunk = JSON.parse(data);
                if (chunk.error) {
                    a.failed = true;
                    showError('Error: ' + (chunk.error.message || JSON.stringify(chunk.error)));
                    return;
                }
                applyChunk(chunk, v, a);
                scrollDown();
            }
        }
    }

    function showFacts(v, a, seconds) {
        const facts = [];
        if (a.stopped) facts.push('stopped');
        else if (a.failed) facts.push('failed');
        else if (a.finish) facts.push('finish: ' + a.finish);
        if (a.usage) {
            facts.push(`${a.usage.prompt_tokens} prompt + ${a.usage.completion_tokens} tokens`);
            if (seconds > 0) facts.push(`${(a.usage.completion_tokens / seconds).toFixed(1)} tokens/s`);
        }
        v.meta.textContent = facts.join(' \u00b7 ');
    }

    async function send(ev) {
        if (ev) ev.preventDefault();
        if (state.controller) return;
        clearError();
        let extra = {};
        const xt = els.extra.value.trim();
        if (xt) {
            try {
                extra = JSON.parse(xt);
            } catch (e) {
                showError('More request fields: not JSON: ' + e.message);
                return;
            }
            if (!extra || typeof extra !== 'object' || Array.isArray(extra)) {
                showError('More request fields: expected a JSON object');
                return;
            }
        }
        saveSettings();
        /* An empty box adds no turn: the conversation is sent as it stands
         * (another answer to it; a new chat with no system prompt is then
         * an empty list, which the API refuses, and its message shows). */
        const text = els.input.value;
        const turn = text.trim() ? {role: 'user', content: text} : null;
        const messages = [];
        if (els.system.value.trim()) messages.push({role: 'system', content: els.system.value});
        messages.push(...state.history);
        if (turn) messages.push(turn);
        const body = Object.assign({}, extra, {
            model: els.model.value || undefined,
            messages: messages,
            stream: true,
            stream_options: {include_usage: true},
            temperature: fieldNumber(els.temperature),
            top_p: fieldNumber(els.topP),
            max_tokens: fieldNumber(els.maxTokens),
        });
        const userDiv = turn ? addUser(text) : null;
        const v = addAssistant();
        const a = {content: '', reasoning: '', calls: [], finish: '', usage: null, stopped: false,
                   failed: false};
        const controller = new AbortController();
        state.controller = controller;
        setBusy(true);
        const t0 = performance.now();
        let started = false;
        try {
            const res = await fetch('/v1/chat/completions', {
                method: 'POST', headers: headers(), body: JSON.stringify(body),
                signal: controller.signal,
            });
            if (!res.ok) {
                showError(await apiError(res));
                a.failed = true;
            } else {
                started = true;
                els.input.value = '';
                await readStream(res, v, a);
            }
        } catch (e) {
            if (e.name === 'AbortError') {
                a.stopped = true;
            } else { /* no answer at all, or a stream cut off or unreadable */
                a.failed = true;
                showError((started ? 'The answer broke off: ' : 'Cannot reach the server: ') +
                          e.message);
            }
        }
        state.controller = null;
        if (!started) { /* refused: the page is as before, the text still in the box */
            if (userDiv) userDiv.remove();
            v.div.remove();
        } else {
            if (turn) state.history.push(turn);
            const msg = {role: 'assistant', content: a.content};
            const calls = a.calls.filter((c) => c);
            if (calls.length) {
                msg.tool_calls = calls;
                if (!a.content) msg.content = null;
            }
            if (a.content || calls.length) state.history.push(msg);
            showFacts(v, a, (performance.now() - t0) / 1000);
        }
        setBusy(false);
        answerEnded();
        els.input.focus();
    }

    function stop() {
        if (state.controller) state.controller.abort();
    }

    function newChat() {
        stop();
        state.history = [];
        els.messages.replaceChildren();
        clearError();
        els.input.focus();
    }

    loadSettings();
    els.form.addEventListener('submit', send);
    els.stop.addEventListener('click', stop);
    els.newChat.addEventListener('click', newChat);
    els.input.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            els.form.requestSubmit();
        }
    });
    els.key.addEventListener('change', () => {
        saveSettings();
        loadModels();
    });
    els.model.addEventListener('change', saveSettings);
    setBusy(false);
    document.body.dataset.answers = '0';
    loadModels();
})();
