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
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { BadRequestError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { tokenBound } from "../policy/token-bound.ts";
import { createEngineServer } from "../engines/llamacpp/engine-server.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { Gateway } from "./gateway.ts";
import { UpstreamPools } from "./upstream.ts";
import { checkDataUrl, checkImageParts, detectFormat, type ImageSettings } from "./image-parts.ts";
import { ImageFetchBudget, type PublicNetwork } from "./image-fetch.ts";
import { privateRangeOf } from "../notify/webhook-address.ts";
import { eventually } from "../../test/support/eventually.ts";

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

/** A catalog entry with vision or not, served by profiles of these engines. */
function modelWith(vision: boolean, engines: string[] = ["llamacpp"]): CatalogModel {
  const profiles = engines.map((engine, at) => ({ name: `p${at}`, engine }));
  return { id: "m", name: "m", definition: { capabilities: { vision, embeddings: false }, profiles } } as unknown as CatalogModel;
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

  test("a model the fleet runs without vision refuses image parts, naming the model, the part and what to do", () => {
    for (const engines of [["llamacpp"], ["vllm"], ["external", "llamacpp"]]) {
      const refused = refusal(() => checkImageParts(chatWith(imagePart(dataUrl(PNG))), modelWith(false, engines)));
      assert.equal(refused.code, "model_has_no_vision", engines.join());
      assert.equal(refused.param, "messages[1].content[1]");
      assert.match(refused.message, /Model 'm' takes no images/);
      assert.match(refused.message, /vision projector.*llama-server.*--projector/);
      assert.match(refused.message, /capabilities\.vision/);
    }
  });

  test("a model served only by external servers takes image parts without capabilities.vision, checked as for any other", () => {
    const external = modelWith(false, ["external", "external"]);
    assert.equal(checkImageParts(chatWith(imagePart(dataUrl(PNG))), external), null);
    assert.notEqual(checkImageParts(chatWith(imagePart("https://example.com/cat.png")), external), null, "its URLs are fetched and inlined");
    assert.equal(refusal(() => checkImageParts(chatWith(imagePart(dataUrl(WEBP, "image/webp"))), external)).code, "unsupported_image_format");
  });

  test("content parts other than text and image_url are 400s for every model, naming the part and what is taken", () => {
    const cases: Array<[unknown, string]> = [
      [{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }, "messages[1].content[1].type"],
      [{ type: "audio_url", audio_url: { url: "http://169.254.169.254/a.wav" } }, "messages[1].content[1].type"],
      [{ type: "video_url", video_url: { url: "https://example.com/v.mp4" } }, "messages[1].content[1].type"],
      [{ type: "input_video", input_video: { url: "https://example.com/v.mp4" } }, "messages[1].content[1].type"],
      [{ type: "file", file: { file_data: "data:application/pdf;base64,AAAA" } }, "messages[1].content[1].type"],
      [{ text: "a part without a type" }, "messages[1].content[1]"],
      ["a bare string", "messages[1].content[1]"],
    ];
    for (const model of [modelWith(true), modelWith(false), modelWith(false, ["external"])]) {
      for (const [part, param] of cases) {
        const refused = refusal(() => checkImageParts(chatWith(part), model));
        assert.deepEqual([refused.code, refused.param], ["unsupported_content_part", param], JSON.stringify(part));
        assert.match(refused.message, /takes text \(or input_text, output_text, refusal\) and image_url parts/);
      }
    }
    const audio = refusal(() => checkImageParts(chatWith({ type: "input_audio", input_audio: {} }), modelWith(true)));
    assert.match(audio.message, /^messages\[1\]\.content\[1\] is a part of type 'input_audio'/);
    const texts = ["text", "input_text", "output_text"].map((type) => ({ type, text: "words" }));
    assert.equal(checkImageParts(chatWith(...texts, { type: "refusal", refusal: "no" }), modelWith(false)), null);
    const completions = refusal(() => checkImageParts({ model: "m", prompt: "Once", multimodal_data: ["AAAA"] }, modelWith(true)));
    assert.deepEqual([completions.code, completions.param], ["unsupported_multimodal_data", "multimodal_data"]);
    assert.match(completions.message, /image_url parts of chat messages/);
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
    // Only the web's ports, so that image URLs cannot probe other services; the flag that allows private addresses allows any port.
    for (const url of ["http://example.com:8080/x.png", "https://example.com:6379/x.png", "http://example.com:25/x.png"]) {
      const port = refusal(() => checkImageParts(chatWith(imagePart(url)), seeing));
      assert.deepEqual([port.code, port.param], ["image_url_port_refused", "messages[1].content[1].image_url.url"], url);
      assert.match(port.message, /ports 80 and 443 only.*--allow-private-image-urls/);
      assert.notEqual(checkImageParts(chatWith(imagePart(url)), seeing, { allowPrivate: true }), null);
    }
    for (const url of ["http://example.com:80/x.png", "https://example.com:443/x.png", "http://example.com:443/x.png", "https://example.com/x.png"]) {
      assert.notEqual(checkImageParts(chatWith(imagePart(url)), seeing), null, url);
    }
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

/** A loopback image host (on `host`, another loopback address for a second one): each path is one behaviour the gateway must handle. */
async function startImageServer(host = "127.0.0.1"): Promise<{ url: string; port: number; requests: string[]; close(): Promise<void> }> {
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
    else if (path.startsWith("/redirect?to=")) res.writeHead(302, { location: decodeURIComponent(path.slice("/redirect?to=".length)) }).end();
    else if (/^\/sized\/\d+\.png$/.test(path)) {
      // A PNG of exactly this many bytes (its signature, then zeros), with its Content-Length.
      const image = Buffer.concat([PNG, Buffer.alloc(Number(path.slice(7, -4)) - PNG.length)]);
      res.writeHead(200, { "content-type": "image/png", "content-length": image.length }).end(image);
    } else if (path === "/loop.png") res.writeHead(302, { location: "/loop.png" }).end();
    else res.writeHead(404, { "content-type": "text/plain" }).end("no such image");
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host}:${port}`,
    port,
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
  /** A host on a private address (127.0.0.2), which the gateway must never reach unless allowed. */
  let privateHost: Awaited<ReturnType<typeof startImageServer>>;
  let weights: string;
  let key: string;
  const extra: Array<{ gateway: Gateway; server: http.Server; pools: UpstreamPools }> = [];

  before(async () => {
    harness = await startHarness();
    upstream = await startFakeUpstream();
    images = await startImageServer();
    privateHost = await startImageServer("127.0.0.2");
    const profiles = [{ name: "up", engine: "external", url: `${upstream.url}/v1` }];
    await harness.addModel({ name: "blind", profiles });
    // The fleet would run this one (it never starts here: the door refuses first).
    weights = mkdtempSync(path.join(tmpdir(), "llmgw-image-parts-"));
    await writeTinyLlamaGguf({ path: path.join(weights, "tiny.gguf"), seed: 1 });
    await harness.addModel({
      name: "blind-local",
      source: { kind: "file", path: path.join(weights, "tiny.gguf") },
      profiles: [...profiles, { name: "cpu", engine: "llamacpp" }],
    });
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
    await privateHost.close();
    rmSync(weights, { recursive: true, force: true });
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

  type Answer = { status: number; headers: Headers; body: { error?: { code: string; param: string | null; message: string } } };

  async function post(base: string, body: unknown, signal?: AbortSignal): Promise<Answer> {
    const response = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      ...(signal === undefined ? {} : { signal }),
    });
    return { status: response.status, headers: response.headers, body: (await response.json()) as Answer["body"] };
  }

  async function chat(base: string, model: string, ...parts: unknown[]): Promise<Answer> {
    return post(base, { ...chatWith(...parts), model });
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

  test("a model the fleet runs without vision answers image parts with 400 naming it and the projector, and its upstream hears nothing", async () => {
    const before = upstream.requests.length;
    const { status, body } = await chat(harness.url, "blind-local", imagePart(dataUrl(PNG)));
    assert.equal(status, 400);
    assert.equal(body.error?.code, "model_has_no_vision");
    assert.equal(body.error?.param, "messages[1].content[1]");
    assert.match(body.error?.message ?? "", /Model 'blind-local' takes no images.*projector/);
    assert.equal(upstream.requests.length, before);
  });

  test("a model served only by external servers passes image parts on without capabilities.vision, inlined as for any model", async () => {
    const gateway = await gatewayWith({ allowPrivate: true });
    const { status, body } = await chat(gateway, "blind", imagePart(`${images.url}/cat.png`));
    assert.equal(status, 200, JSON.stringify(body));
    assert.deepEqual(upstream.requests.at(-1)!.body.messages[1].content[1], imagePart(dataUrl(PNG)));
    assert.equal((await chat(harness.url, "blind", { type: "text", text: "and text" })).status, 200, "text parts pass as ever");
  });

  test("audio, video, files and parts without a type are 400s at the door, for any model, and nothing is fetched or sent", async () => {
    const seen = images.requests.length;
    for (const model of ["seeing", "blind"]) {
      for (const part of [
        { type: "input_audio", input_audio: { data: "UklGRg==", format: "wav" } },
        { type: "audio_url", audio_url: { url: `${images.url}/cat.wav` } },
        { type: "video_url", video_url: { url: `${images.url}/cat.mp4` } },
      ]) {
        const before = upstream.requests.length;
        const { status, body } = await chat(harness.url, model, part);
        assert.equal(status, 400, JSON.stringify(body));
        assert.deepEqual([body.error?.code, body.error?.param], ["unsupported_content_part", "messages[1].content[1].type"]);
        assert.match(body.error?.message ?? "", new RegExp(`part of type '${part.type}'.*image_url`));
        assert.equal(upstream.requests.length, before, "nothing reached the upstream");
      }
    }
    assert.equal(images.requests.length, seen, "no URL was fetched");
    const completion = await fetch(`${harness.url}/v1/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "seeing", prompt: "Describe", multimodal_data: [PNG.toString("base64")] }),
    });
    assert.equal(completion.status, 400);
    assert.equal(((await completion.json()) as Answer["body"]).error?.code, "unsupported_multimodal_data");
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

  test("by default the server refuses image URLs on loopback and on other ports than 80 and 443, at the door", async () => {
    const literal = await refused(harness.url, "image_url_private_address", imagePart(`${images.url}/cat.png`));
    assert.match(literal.message, /127\.0\.0\.1 is in 127\.0\.0\.0\/8, loopback/);
    const port = await refused(harness.url, "image_url_port_refused", imagePart("http://images.example:8080/cat.png"));
    assert.match(port.message, /port 8080; llmgw fetches images from ports 80 and 443 only/);
  });

  /**
   * A gateway that refuses private addresses, in a stand-in internet where the image server
   * (127.0.0.1, any port) is a public host and 127.0.0.2 a private one, with names resolved by `resolve`.
   */
  function publicImagesGateway(resolve?: ImageSettings["resolve"]): Promise<string> {
    const network: PublicNetwork = { rangeOf: (address) => (address === "127.0.0.1" ? null : privateRangeOf(address)), portAllowed: () => true };
    return gatewayWith({ network, ...(resolve === undefined ? {} : { resolve }) });
  }

  test("a public image URL that redirects to a private address is refused, the address given or a name for it, and the private host hears nothing", async () => {
    const gateway = await publicImagesGateway(async (name) => [{ address: name === "private.example" ? "127.0.0.2" : "127.0.0.1", family: 4 }]);
    assert.equal((await chat(gateway, "seeing", imagePart(`${images.url}/cat.png`))).status, 200, "the public host itself is fetched");
    for (const target of [`${privateHost.url}/cat.png`, `http://private.example:${privateHost.port}/cat.png`]) {
      const seen = images.requests.length;
      const bounced = await refused(gateway, "image_url_private_address", imagePart(`${images.url}/redirect?to=${encodeURIComponent(target)}`));
      assert.match(bounced.message, /127\.0\.0\.2.* is in 127\.0\.0\.0\/8, loopback/);
      assert.equal(images.requests.length, seen + 1, "the public host was asked and redirected");
    }
    assert.deepEqual(privateHost.requests, [], "the private host was never reached");
  });

  test("DNS rebinding: a name public for the first connection and private for the next is refused on the address connected to", async () => {
    // The first lookup (the first hop) answers the public host; every later one, a private address.
    let lookups = 0;
    const gateway = await publicImagesGateway(async () => {
      lookups += 1;
      return [{ address: lookups === 1 ? "127.0.0.1" : "127.0.0.2", family: 4 }];
    });
    const next = `http://images.example:${privateHost.port}/cat.png`;
    const seen = images.requests.length;
    const rebound = await refused(
      gateway,
      "image_url_private_address",
      imagePart(`http://images.example:${images.port}/redirect?to=${encodeURIComponent(next)}`),
    );
    assert.match(rebound.message, /127\.0\.0\.2 \(what 'images\.example' resolves to\) is in 127\.0\.0\.0\/8/);
    assert.equal(images.requests.length, seen + 1, "the first hop reached the public address");
    assert.deepEqual(privateHost.requests, [], "the private address was never connected to");
  });

  test("a request whose images would take its body over --max-body is a 400 naming the limit, whether fetched or sent", async () => {
    const gateway = await gatewayWith({ allowPrivate: true, maxBytes: 4096, maxBodyBytes: 6000 });
    assert.equal((await chat(gateway, "seeing", imagePart(`${images.url}/sized/2000.png`))).status, 200);
    // Three images each under --max-image-bytes, 8 KiB of base64 together: the fetching stops at the limit.
    const sized = imagePart(`${images.url}/sized/2000.png`);
    const over = await refused(gateway, "images_over_max_body", sized, sized, sized);
    assert.match(over.message, /over 6 KiB, the largest request body this server takes \(--max-body\)/);
    // A data URL and a fetched image that fit, with text that does not: the body as built is measured.
    const inBody = imagePart(dataUrl(Buffer.concat([PNG, Buffer.alloc(2000 - PNG.length)])));
    await refused(gateway, "images_over_max_body", { type: "text", text: "x".repeat(1000) }, inBody, sized);
  });

  test("past the process's budget of image bytes in flight, a request is a 503 with Retry-After until the budget frees", async () => {
    const budget = new ImageFetchBudget(64);
    const gateway = await gatewayWith({ allowPrivate: true, fetchBudget: budget, fetchTimeoutMs: 60_000 });
    // One request holds bytes of an image that never finishes arriving.
    const leave = new AbortController();
    const holding = post(gateway, { ...chatWith(imagePart(`${images.url}/slow.png`)), model: "seeing" }, leave.signal).catch((error: unknown) => error);
    await eventually("the first request holds image bytes", () => budget.inUse > 0);
    const before = upstream.requests.length;
    const busy = await chat(gateway, "seeing", imagePart(`${images.url}/sized/100.png`));
    assert.equal(busy.status, 503, JSON.stringify(busy.body));
    assert.equal(busy.body.error?.code, "image_fetch_busy");
    assert.equal(busy.headers.get("retry-after"), "2");
    assert.match(busy.body.error?.message ?? "", /as much as it fetches at once \(64 B\).*data URLs/);
    assert.equal(upstream.requests.length, before);
    leave.abort();
    await holding;
    await eventually("the budget is given back when the client leaves", () => budget.inUse === 0);
    // Alone, a request may take more than the budget: it is never refused forever.
    assert.equal((await chat(gateway, "seeing", imagePart(`${images.url}/sized/100.png`))).status, 200);
    assert.equal(budget.inUse, 0);
  });

  test("a host that is not found, does not answer or refuses the connection gets one message, so answers do not map the network", async () => {
    const resolve = (name: string, signal: AbortSignal) =>
      name === "missing.test"
        ? Promise.reject(Object.assign(new Error("queryA ENOTFOUND missing.test"), { code: "ENOTFOUND" }))
        : name === "silent.test"
          ? new Promise<never>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)))
          : Promise.resolve([{ address: "127.0.0.1", family: 4 }]);
    const gateway = await gatewayWith({ allowPrivate: true, resolve, fetchTimeoutMs: 1000 });
    const closed = await startImageServer();
    await closed.close();
    const messages: string[] = [];
    for (const url of ["http://silent.test/cat.png", "http://missing.test/cat.png", `${closed.url}/cat.png`]) {
      messages.push((await refused(gateway, "image_fetch_failed", imagePart(url))).message.replace(url, "URL"));
    }
    assert.match(messages[0]!, /its host could not be reached, or did not answer within 1 s \(--image-fetch-timeout\)/);
    assert.equal(new Set(messages).size, 1, messages.join("\n"));
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
