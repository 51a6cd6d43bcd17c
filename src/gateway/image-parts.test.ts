// Image parts at the gateway's door (image-parts.ts, image-fetch.ts): the checks on their
// own, then over real HTTP: a real llmgw server in this process with external models in
// front of a counting fake upstream (test/support/fake-upstream.ts), an image server on
// loopback for the URLs the gateway fetches, and the bundled engine's own HTTP server.
// Where a test needs other image settings than the server's defaults (loopback allowed,
// short deadlines, fetching off), it serves a second Gateway over the same server's
// catalog, keys and replicas.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { BadRequestError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { tokenBound } from "../policy/token-bound.ts";
import { createEngineServer } from "../engines/llamacpp/engine-server.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { Gateway } from "./gateway.ts";
import { UpstreamPools } from "./upstream.ts";
import { checkDataUrl, checkImageParts, detectFormat, type ImageSettings } from "./image-parts.ts";

// The first bytes of real files of each format: all a signature check reads.
/** PNG: the signature and the IHDR chunk of a 1x1 RGBA image. */
const PNG = Buffer.from("89504e470d0a1a0a0000000d4948445200000001000000010806000000" + "1f15c489", "hex");
/** JPEG: SOI and a JFIF APP0 segment. */
const JPEG = Buffer.from("ffd8ffe000104a46494600010100000100010000", "hex");
const GIF = Buffer.from("474946383961010001008000000000", "hex");
/** BMP: "BM", sizes, and a BITMAPINFOHEADER (40 bytes) at offset 14. */
const BMP = Buffer.from("424d3a0000000000000036000000" + "28000000010000000100000001001800", "hex");
const WEBP = Buffer.concat([Buffer.from("RIFF"), Buffer.from([0x24, 0, 0, 0]), Buffer.from("WEBPVP8 ")]);

const dataUrl = (bytes: Buffer, type = "image/png") => `data:${type};base64,${bytes.toString("base64")}`;
const imagePart = (url: string, detail?: string) => ({ type: "image_url", image_url: { url, ...(detail === undefined ? {} : { detail }) } });
const chatWith = (...parts: unknown[]) => ({
  model: "m",
  messages: [
    { role: "system", content: "Describe." },
    { role: "user", content: [{ type: "text", text: "What is it?" }, ...parts] },
  ],
});

function modelWith(vision: boolean): CatalogModel {
  return { id: "m", name: "m", definition: { capabilities: { vision, embeddings: false } } } as unknown as CatalogModel;
}

/** The error a synchronous check throws, as code and param. */
function refusal(check: () => unknown): { code: string; param: string | null; message: string } {
  try {
    check();
  } catch (error) {
    assert.ok(error instanceof BadRequestError, String(error));
    return { code: error.code, param: error.param, message: error.message };
  }
  assert.fail("expected a 400");
}

describe("image checks", () => {
  test("a text-only body, and one whose images are data URLs in OpenAI's shape, go upstream as they came", () => {
    assert.equal(checkImageParts(chatWith({ type: "text", text: "more" }), modelWith(false)), null);
    assert.equal(checkImageParts({ model: "m", prompt: "Once" }, modelWith(false)), null);
    assert.equal(checkImageParts(chatWith(imagePart(dataUrl(PNG)), imagePart(dataUrl(JPEG, "image/jpeg"), "low")), modelWith(true)), null);
  });

  test("a model without vision refuses image parts, naming the model, the part and what to do", () => {
    const refused = refusal(() => checkImageParts(chatWith(imagePart(dataUrl(PNG))), modelWith(false)));
    assert.equal(refused.code, "model_has_no_vision");
    assert.equal(refused.param, "messages[1].content[1]");
    assert.match(refused.message, /Model 'm' takes no images/);
    assert.match(refused.message, /vision projector.*llama-server.*--projector/);
    assert.match(refused.message, /capabilities\.vision/);
  });

  test("data URLs: the formats llama.cpp decodes pass; WebP, other types, loose base64, text and oversize are 400s", () => {
    const param = "messages[0].content[0].image_url.url";
    for (const [bytes, type] of [
      [PNG, "image/png"],
      [JPEG, "image/jpeg"],
      [JPEG, "image/jpg"],
      [GIF, "image/gif"],
      [BMP, "image/bmp"],
      // The declared type need not match: every decoder reads the bytes' own signature.
      [JPEG, "image/png"],
    ] as const) {
      checkDataUrl(dataUrl(bytes, type), param, 1024);
    }
    const code = (url: string, maxBytes = 1024) => refusal(() => checkDataUrl(url, param, maxBytes));
    const webp = code(dataUrl(WEBP, "image/webp"));
    assert.equal(webp.code, "unsupported_image_format");
    assert.match(webp.message, /WebP.*PNG or JPEG/);
    assert.equal(code(dataUrl(WEBP, "image/png")).code, "unsupported_image_format", "WebP bytes under another name");
    assert.equal(code(dataUrl(PNG, "image/svg+xml")).code, "unsupported_image_format");
    assert.equal(code(dataUrl(PNG, "text/plain")).code, "not_an_image");
    const text = code(dataUrl(Buffer.from("hello, I am not a picture at all"), "image/png"));
    assert.deepEqual([text.code, text.param], ["not_an_image", param]);
    assert.match(text.message, /not an image/);
    assert.equal(code(dataUrl(Buffer.from("BM but just text after it"), "image/bmp")).code, "not_an_image", "'BM' alone is not a bitmap");
    assert.equal(code(`data:image/png,${PNG.toString("hex")}`).code, "invalid_image_url", "not base64");
    const base64 = PNG.toString("base64");
    assert.equal(code(`data:image/png;base64,${base64.slice(0, 20)}\n${base64.slice(20)}`).code, "invalid_image_url", "a line break");
    const padded = Buffer.concat([PNG, Buffer.alloc(1)]).toString("base64");
    assert.ok(padded.endsWith("=="));
    checkDataUrl(`data:image/png;base64,${padded}`, param, 1024);
    assert.equal(code(`data:image/png;base64,${padded.replace(/=+$/, "")}`).code, "invalid_image_url", "no padding");
    assert.equal(code(`data:image/png;base64,${padded}==`).code, "invalid_image_url", "too much padding");
    assert.equal(code(`data:image/png;base64,${base64.replace(/\+/g, "-").replace(/\//g, "_")}A==`).code, "invalid_image_url");
    assert.equal(code(`data:image/png;base64,${base64.slice(0, 8)}=${base64.slice(9)}`).code, "invalid_image_url", "padding inside");
    const big = code(dataUrl(Buffer.concat([PNG, Buffer.alloc(2000)])), 1024);
    assert.equal(big.code, "image_too_large");
    assert.match(big.message, /2 KiB, over the limit of 1 KiB.*--max-image-bytes/);
  });

  test("counts, URLs the server will not fetch, and parts without a URL are 400s at the door", () => {
    const seeing = modelWith(true);
    const png = imagePart(dataUrl(PNG));
    const many = refusal(() => checkImageParts(chatWith(png, png, png), seeing, { maxImages: 2 }));
    assert.deepEqual([many.code, many.param], ["too_many_images", "messages[1].content[3]"]);
    const off = refusal(() => checkImageParts(chatWith(imagePart("https://example.com/cat.png")), seeing, { urls: "refuse" }));
    assert.deepEqual([off.code, off.param], ["image_urls_refused", "messages[1].content[1].image_url.url"]);
    assert.match(off.message, /data URL/);
    for (const url of ["http://127.0.0.1/x.png", "http://[::1]/x.png", "http://169.254.169.254/latest/meta-data", "https://10.1.2.3/x.png"]) {
      const privateUrl = refusal(() => checkImageParts(chatWith(imagePart(url)), seeing));
      assert.equal(privateUrl.code, "image_url_private_address", url);
      assert.match(privateUrl.message, /--allow-private-image-urls/);
    }
    assert.notEqual(checkImageParts(chatWith(imagePart("http://127.0.0.1/x.png")), seeing, { allowPrivate: true }), null);
    assert.equal(refusal(() => checkImageParts(chatWith(imagePart("file:///etc/passwd")), seeing)).code, "invalid_image_url");
    assert.equal(refusal(() => checkImageParts(chatWith(imagePart("iVBORw0KGgo=")), seeing)).code, "invalid_image_url", "raw base64");
    const missing = refusal(() => checkImageParts(chatWith({ type: "image_url", image_url: {} }), seeing));
    assert.deepEqual([missing.code, missing.param], ["invalid_image_url", "messages[1].content[1].image_url.url"]);
  });

  test("the string form of image_url is checked like the object form and sent on in OpenAI's shape, with a body the limits can measure", async () => {
    const seeing = modelWith(true);
    const loose = refusal(() => checkImageParts(chatWith({ type: "image_url", image_url: dataUrl(Buffer.from("not an image")) }), seeing));
    assert.deepEqual([loose.code, loose.param], ["not_an_image", "messages[1].content[1].image_url"]);
    const body = chatWith({ type: "image_url", image_url: dataUrl(PNG) });
    const inlining = checkImageParts(body, seeing);
    assert.ok(inlining !== null, "llama-server reads only image_url.url: the part must be rewritten");
    const sent = await inlining.inline(new AbortController().signal);
    assert.deepEqual((sent.body.messages as Array<{ content: unknown }>)[1]?.content, [{ type: "text", text: "What is it?" }, imagePart(dataUrl(PNG))]);
    assert.equal(sent.raw.toString(), JSON.stringify(sent.body));
    assert.deepEqual(body.messages[1]?.content[1], { type: "image_url", image_url: dataUrl(PNG) }, "the parsed body is not changed");
    // The limits discount an image part's bytes from the body's: with the body as sent and
    // its own length, a large inlined image leaves the bound at the allowance, never below.
    const largeBody = chatWith({ type: "image_url", image_url: dataUrl(Buffer.concat([PNG, Buffer.alloc(100_000)])) });
    const large = await checkImageParts(largeBody, seeing)!.inline(new AbortController().signal);
    const bound = tokenBound("/v1/chat/completions", large.body, seeing, large.raw.length);
    assert.ok(bound.prompt > 16_384 && bound.prompt < 20_000, `prompt bound ${bound.prompt}`);
  });

  test("format signatures", () => {
    assert.equal(detectFormat(PNG), "png");
    assert.equal(detectFormat(JPEG), "jpeg");
    assert.equal(detectFormat(GIF), "gif");
    assert.equal(detectFormat(BMP), "bmp");
    assert.equal(detectFormat(WEBP), "webp");
    assert.equal(detectFormat(Buffer.from("<svg xmlns=")), null);
    assert.equal(detectFormat(Buffer.alloc(0)), null);
  });
});

/** A loopback image host: each path is one behaviour the gateway must handle. */
async function startImageServer(): Promise<{ url: string; requests: string[]; close(): Promise<void> }> {
  const requests: string[] = [];
  const server = http.createServer((req, res) => {
    const path = req.url ?? "/";
    requests.push(path);
    if (path === "/cat.png") res.writeHead(200, { "content-type": "image/png", "content-length": PNG.length }).end(PNG);
    else if (path === "/cat.jpg") res.writeHead(200, { "content-type": "image/jpeg" }).end(JPEG);
    else if (path === "/slow.png")
      res.writeHead(200, { "content-type": "image/png" }).write(PNG.subarray(0, 4)); // and nothing more
    else if (path === "/big.png") {
      // No Content-Length: the limit must stop the reading itself.
      res.writeHead(200, { "content-type": "image/png" });
      res.write(PNG);
      for (let i = 0; i < 16; i += 1) res.write(Buffer.alloc(1024));
      res.end();
    } else if (path === "/declared-big.png") res.writeHead(200, { "content-type": "image/png", "content-length": 1_000_000 }).write(PNG);
    else if (path === "/text.png") res.writeHead(200, { "content-type": "image/png" }).end("<html>Sign in to see this image</html>");
    else if (path === "/cat.webp") res.writeHead(200, { "content-type": "image/webp" }).end(WEBP);
    else if (path === "/moved.png") res.writeHead(302, { location: "/cat.png" }).end();
    else if (path === "/loop.png") res.writeHead(302, { location: "/loop.png" }).end();
    else res.writeHead(404, { "content-type": "text/plain" }).end("no such image");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe("image parts through the gateway", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  let images: Awaited<ReturnType<typeof startImageServer>>;
  let key: string;
  const extra: Array<{ gateway: Gateway; server: http.Server; pools: UpstreamPools }> = [];

  before(async () => {
    harness = await startHarness();
    upstream = await startFakeUpstream();
    images = await startImageServer();
    const profiles = [{ name: "up", engine: "external", url: `${upstream.url}/v1` }];
    await harness.addModel({ name: "blind", profiles });
    await harness.addModel({ name: "seeing", profiles, capabilities: { vision: true, embeddings: false } });
    key = await harness.clientKey();
  });

  after(async () => {
    for (const { gateway, server, pools } of extra) {
      gateway.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await pools.closeAll();
    }
    await harness.close();
    await upstream.close();
    await images.close();
  });

  /** Another gateway over the harness's catalog, keys and replicas, with these image settings; returns its URL. */
  async function gatewayWith(settings: Partial<ImageSettings>): Promise<string> {
    const pools = new UpstreamPools();
    const { catalog, keys, replicas } = harness.server;
    const gateway = new Gateway({ catalog, keys, replicas, pools, logger: silentLogger(), images: settings });
    const server = http.createServer(gateway.handle);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    extra.push({ gateway, server, pools });
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  async function chat(
    base: string,
    model: string,
    ...parts: unknown[]
  ): Promise<{ status: number; body: { error?: { code: string; param: string | null; message: string } } }> {
    const response = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ ...chatWith(...parts), model }),
    });
    return { status: response.status, body: (await response.json()) as { error?: { code: string; param: string | null; message: string } } };
  }

  /** Sends a request that must be refused with `code` before the upstream hears of it. */
  async function refused(base: string, code: string, ...parts: unknown[]): Promise<{ param: string | null; message: string }> {
    const before = upstream.requests.length;
    const { status, body } = await chat(base, "seeing", ...parts);
    assert.equal(status, 400, JSON.stringify(body));
    assert.equal(body.error?.code, code, JSON.stringify(body));
    assert.equal(upstream.requests.length, before, "nothing reached the upstream");
    return { param: body.error.param, message: body.error.message };
  }

  test("a model without vision answers image parts with 400 naming it and the projector, and its upstream hears nothing", async () => {
    const before = upstream.requests.length;
    const { status, body } = await chat(harness.url, "blind", imagePart(dataUrl(PNG)));
    assert.equal(status, 400);
    assert.equal(body.error?.code, "model_has_no_vision");
    assert.equal(body.error?.param, "messages[1].content[1]");
    assert.match(body.error?.message ?? "", /Model 'blind' takes no images.*projector/);
    assert.equal(upstream.requests.length, before);
    assert.equal((await chat(harness.url, "blind", { type: "text", text: "and text" })).status, 200, "text parts still pass");
  });

  test("bad data URLs and too many images are 400s that name the part, with nothing sent upstream", async () => {
    const text = await refused(harness.url, "not_an_image", imagePart(dataUrl(PNG)), imagePart(dataUrl(Buffer.from("just some text"))));
    assert.equal(text.param, "messages[1].content[2].image_url.url");
    await refused(harness.url, "unsupported_image_format", imagePart(dataUrl(WEBP, "image/webp")));
    await refused(
      harness.url,
      "invalid_image_url",
      imagePart(`data:image/png;base64,${PNG.toString("base64").slice(0, 12)}\r\n${PNG.toString("base64").slice(12)}`),
    );
    await refused(harness.url, "too_many_images", ...Array.from({ length: 9 }, () => imagePart(dataUrl(PNG))));
  });

  test("by default the server refuses image URLs on loopback, at the door and, for a name, when connecting", async () => {
    const literal = await refused(harness.url, "image_url_private_address", imagePart(`${images.url}/cat.png`));
    assert.match(literal.message, /127\.0\.0\.1 is in 127\.0\.0\.0\/8, loopback/);
    // A name that resolves to a public address at the door and to loopback when connecting
    // (DNS rebinding) is refused on the address actually connected to.
    const rebinding = await gatewayWith({ resolve: async () => [{ address: "127.0.0.1", family: 4 }] });
    const port = new URL(images.url).port;
    const seen = images.requests.length;
    const named = await refused(rebinding, "image_url_private_address", imagePart(`http://images.example:${port}/cat.png`));
    assert.match(named.message, /127\.0\.0\.1 \(what 'images\.example' resolves to\)/);
    assert.equal(images.requests.length, seen, "the image server was never connected to");
  });

  test("a data URL and a fetched image (after a redirect) reach the upstream as data URLs, detail kept", async () => {
    const gateway = await gatewayWith({ allowPrivate: true });
    const { status, body } = await chat(gateway, "seeing", imagePart(dataUrl(GIF, "image/gif"), "high"), imagePart(`${images.url}/moved.png`, "low"), {
      type: "image_url",
      image_url: `${images.url}/cat.jpg`,
    });
    assert.equal(status, 200, JSON.stringify(body));
    const sent = upstream.requests.at(-1)!.body.messages[1].content;
    assert.deepEqual(sent, [
      { type: "text", text: "What is it?" },
      imagePart(dataUrl(GIF, "image/gif"), "high"),
      imagePart(dataUrl(PNG, "image/png"), "low"),
      imagePart(dataUrl(JPEG, "image/jpeg")),
    ]);
  });

  test("fetched images that are slow, too large, not images, missing or redirect forever are 400s, and the upstream hears nothing", async () => {
    const gateway = await gatewayWith({ allowPrivate: true, fetchTimeoutMs: 500, maxBytes: 4096 });
    const slow = await refused(gateway, "image_fetch_failed", imagePart(`${images.url}/slow.png`));
    assert.match(slow.message, /did not arrive within 0\.5 s \(--image-fetch-timeout\)/);
    assert.equal(slow.param, "messages[1].content[1].image_url.url");
    assert.match((await refused(gateway, "image_too_large", imagePart(`${images.url}/big.png`))).message, /more than 4 KiB/);
    assert.match((await refused(gateway, "image_too_large", imagePart(`${images.url}/declared-big.png`))).message, /by its Content-Length/);
    assert.equal((await refused(gateway, "not_an_image", imagePart(`${images.url}/text.png`))).param, "messages[1].content[1].image_url.url");
    assert.match((await refused(gateway, "unsupported_image_format", imagePart(`${images.url}/cat.webp`))).message, /PNG or JPEG/);
    assert.match((await refused(gateway, "image_fetch_failed", imagePart(`${images.url}/gone.png`))).message, /answered HTTP 404/);
    assert.match((await refused(gateway, "image_fetch_failed", imagePart(`${images.url}/loop.png`))).message, /redirected more than 3 times/);
    // One failing image fails the request even when the other is fine.
    await refused(gateway, "not_an_image", imagePart(`${images.url}/cat.png`), imagePart(`${images.url}/text.png`));
  });

  test("with fetching off, an image URL is a 400 that asks for a data URL, and the image host hears nothing", async () => {
    const gateway = await gatewayWith({ urls: "refuse", allowPrivate: true });
    const seen = images.requests.length;
    const off = await refused(gateway, "image_urls_refused", imagePart(`${images.url}/cat.png`));
    assert.match(off.message, /--image-urls refuse.*data URL/);
    assert.equal(images.requests.length, seen);
    assert.equal((await chat(gateway, "seeing", imagePart(dataUrl(PNG)))).status, 200, "data URLs still pass");
  });

  test("the bundled engine answers an image part with 400 naming what is missing, even before its model has loaded", async () => {
    const engine = createEngineServer({ key: "engine-key", modelName: "tiny", logger: silentLogger() });
    const { port } = await engine.listen("127.0.0.1", 0);
    try {
      const response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: "Bearer engine-key", "content-type": "application/json" },
        body: JSON.stringify(chatWith(imagePart(dataUrl(PNG)))),
      });
      assert.equal(response.status, 400);
      const { error } = (await response.json()) as { error: { code: string; param: string; message: string } };
      assert.equal(error.code, "engine_has_no_vision");
      assert.equal(error.param, "messages.1.content.1");
      assert.match(error.message, /node-llama-cpp\) takes no image input.*llama-server/);
    } finally {
      await engine.shutdown(1000);
    }
  });
});
