// What the gateway does with the image parts of a chat request before any engine sees
// them (`{"type":"image_url","image_url":{"url":...,"detail"?}}` in a message's content).
// A request whose images fail any check gets a 400 naming the field, and nothing reaches
// an engine:
// - a message's content parts are text parts and image_url parts, nothing else, for every
//   model: other media (input_audio, audio_url, video_url, file, ...) are not checked here,
//   and an engine would take them as they come, some fetching their URLs itself from the
//   node's network (vLLM does), past every check below;
// - a model the fleet runs (any llamacpp or vllm profile) must have vision (its catalog
//   entry's capabilities.vision): an engine without a projector would refuse the part or,
//   worse, drop it and answer anyway. A model served only by external servers passes
//   images on (checked and inlined as below): the catalog cannot know what those read,
//   and capabilities.vision defaults to false, so refusing would break every external
//   vision model that was never marked;
// - at most --max-images images a request;
// - a data URL must be `data:image/<png|jpeg|gif|bmp>;base64,` with strict base64, and its
//   bytes must start like one of those formats: those are what llama.cpp's image loader
//   (stb_image in tools/mtmd) decodes. WebP is not (only a build with video support
//   decodes it, through ffmpeg), so a WebP is refused with the advice to send PNG or JPEG;
// - strict base64, because llama-server's decoder stops at the first character outside
//   the alphabet (a line break, a URL-safe '-') and would silently see a truncated image;
// - an image's decoded size is at most --max-image-bytes (default 10 MiB, llama-server's
//   own limit for the images it downloads);
// - an http(s) URL is fetched by the gateway (image-fetch.ts), checked as above, and sent
//   on as a data URL; with --image-urls refuse, it is refused with the advice to send a
//   data URL;
// - the body with every image as a data URL must fit --max-body (each image costs 4/3 of
//   its size in base64), so that an engine gets no body larger than a client could send
//   (llama-server itself takes at most 100 MB): one byte count per request, shared by its
//   data URLs and fetches, stops the fetching as soon as it would not fit. And the process
//   fetches at most PROCESS_IMAGE_FETCH_BUDGET bytes at once for all requests together
//   (503 with Retry-After beyond), so that many such requests cannot exhaust its memory.
//
// URLs are inlined for every upstream, external servers included: the bytes the gateway
// checked are then the bytes the model sees (a URL fetched again later may answer
// something else), every engine reads a data URL (llama-server, vLLM, OpenAI), and none
// needs network access or a fetch policy of its own.
//
// Checks run in two steps: `checkImageParts` (synchronous, before the limits and guards)
// refuses what the request itself gets wrong; what it returns fetches, after the limits
// have admitted the request, so a key over its limits cannot make the gateway fetch.
import { BadRequestError, UnavailableError } from "../core/errors.ts";
import { formatBytes, printable } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import {
  checkRemoteImageUrl,
  dnsResolver,
  fetchImage,
  type ImageFetchBudget,
  imageAgent,
  INTERNET,
  PROCESS_IMAGE_FETCH_BUDGET,
  type PublicNetwork,
  type ResolveImageHost,
} from "./image-fetch.ts";
import type { GatewayRequestBody } from "./request-schemas.ts";

export interface ImageSettings {
  /** --image-urls: http(s) image URLs are fetched by the gateway (default), or refused. */
  urls: "fetch" | "refuse";
  /** --max-image-bytes: an image's decoded size, data URL or fetched. */
  maxBytes: number;
  /** --max-images: image parts in one request. */
  maxImages: number;
  /** --image-fetch-timeout: all fetched images of a request must have arrived within this. */
  fetchTimeoutMs: number;
  /** --allow-private-image-urls: image URLs may reach private, loopback and link-local addresses, on any port. */
  allowPrivate: boolean;
  /** --max-body: the body with its images inlined as data URLs must fit it too (default: the gateway's default). */
  maxBodyBytes?: number;
  /** How host names are resolved when fetching (default: c-ares, image-fetch.ts's dnsResolver); tests play a DNS here. */
  resolve?: ResolveImageHost;
  /** Image bytes being fetched at once (default: the process's budget, shared by every gateway in it). */
  fetchBudget?: ImageFetchBudget;
  /** Tests only: which addresses count as public and which ports are allowed (default: the internet's). */
  network?: PublicNetwork;
}

export const DEFAULT_IMAGE_SETTINGS: Readonly<ImageSettings> = {
  urls: "fetch",
  maxBytes: 10 * 1024 * 1024,
  maxImages: 8,
  fetchTimeoutMs: 10_000,
  allowPrivate: false,
};

/** The formats llama.cpp's image loader decodes (stb_image), by their media type. */
const FORMATS = { png: "image/png", jpeg: "image/jpeg", gif: "image/gif", bmp: "image/bmp" } as const;
type Format = keyof typeof FORMATS | "webp";

const MEDIA_TYPES: Readonly<Record<string, Format>> = {
  "image/png": "png",
  "image/jpeg": "jpeg",
  // Not registered, but common enough that refusing it would only annoy.
  "image/jpg": "jpeg",
  "image/gif": "gif",
  "image/bmp": "bmp",
  "image/x-ms-bmp": "bmp",
  "image/webp": "webp",
};

/**
 * The gateway's default --max-body (gateway.ts's DEFAULT_MAX_BODY_BYTES, not imported:
 * gateway.ts imports this module), for settings that do not say theirs.
 */
const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;

/** What a fetched image's base64 costs in the body, per byte of the image. */
const BASE64_GROWTH = 4 / 3;

/** Parts that carry text and nothing else (the guards read each of them as text: policy/guards.ts). */
const TEXT_PARTS = new Set(["text", "input_text", "output_text", "refusal"]);
const ACCEPTED_PARTS = "text (or input_text, output_text, refusal) and image_url";

/** Host names are resolved by c-ares, cancellable at the deadline (image-fetch.ts says why). */
const defaultResolve = dnsResolver();

const SUPPORTED = "PNG, JPEG, GIF or BMP";
const WEBP_ADVICE = `llama.cpp's image loader does not decode WebP; convert the image to PNG or JPEG`;

/** An image part where it sits in the request. */
interface ImagePart {
  message: number;
  index: number;
  part: Record<string, unknown>;
}

/** Image parts that need the body rewritten: URLs to fetch, and parts in the string form. */
interface Rewrite {
  at: ImagePart;
  /** Null: the URL is a checked data URL already; only the part's shape changes. */
  fetch: { url: URL; param: string } | null;
  url: string;
}

/** What is left to do after the door's checks: fetch URLs (and give every part OpenAI's shape), then send the new body. */
export interface ImageInlining {
  /**
   * `rawBytes`: the size of the body as it came, when the caller has it; what fetched
   * images add is counted against --max-body from there (else from its data URLs alone,
   * and the whole body is measured once built).
   */
  inline(cancel: AbortSignal, rawBytes?: number): Promise<{ body: GatewayRequestBody; raw: Buffer }>;
}

/**
 * Checks every image part of a chat body (400 on the first that fails) and returns what
 * must still happen before the body goes upstream, or null when it can go as it came. A
 * body without image parts costs one pass over its messages.
 */
export function checkImageParts(body: GatewayRequestBody, model: CatalogModel, settings: Partial<ImageSettings> = {}): ImageInlining | null {
  if (body.multimodal_data !== undefined) {
    throw new BadRequestError(
      "multimodal_data: llmgw does not pass llama-server's multimodal_data on; send images as image_url parts of chat messages (POST /v1/chat/completions), which the gateway checks.",
      { code: "unsupported_multimodal_data", param: "multimodal_data" },
    );
  }
  const found = imagePartsOf(body);
  if (found === null) return null;
  const first = found[0]!;
  if (!takesImages(model)) throw noVision(model.name, partParam(first));
  const maxImages = settings.maxImages ?? DEFAULT_IMAGE_SETTINGS.maxImages;
  if (found.length > maxImages) {
    throw new BadRequestError(
      `The request has ${found.length} images; llmgw takes at most ${maxImages} in one request (--max-images). Send fewer, or split the conversation.`,
      { code: "too_many_images", param: partParam(found[maxImages]!) },
    );
  }
  const full = { ...DEFAULT_IMAGE_SETTINGS, ...settings };
  const rewrites: Rewrite[] = [];
  // What the images already in the body take of it: a fetched image adds to this.
  let dataUrlBytes = 0;
  for (const at of found) {
    const { url, param, stringForm } = urlOf(at);
    if (url.startsWith("data:")) {
      checkDataUrl(url, param, full.maxBytes);
      dataUrlBytes += url.length;
      if (stringForm) rewrites.push({ at, fetch: null, url });
      continue;
    }
    rewrites.push({ at, fetch: { url: remoteUrl(url, param, full), param }, url });
  }
  if (rewrites.length === 0) return null;
  return { inline: (cancel, rawBytes) => inlineImages({ body, rewrites, settings: full, cancel, bodyBytes: rawBytes ?? dataUrlBytes }) };
}

/** Whether image parts may go to the model: it has vision, or only external servers serve it (they decide for themselves). */
function takesImages(model: CatalogModel): boolean {
  const { capabilities, profiles } = model.definition;
  return capabilities.vision || profiles.every((profile) => profile.engine === "external");
}

/**
 * The image parts of the body's messages, or null when it has none (the common case
 * allocates nothing). Every other part must be a text part: anything else is refused here.
 */
function imagePartsOf(body: GatewayRequestBody): ImagePart[] | null {
  const messages = body.messages;
  if (!Array.isArray(messages)) return null;
  let found: ImagePart[] | null = null;
  for (let message = 0; message < messages.length; message += 1) {
    const content = (messages[message] as { content?: unknown } | null)?.content;
    if (!Array.isArray(content)) continue;
    for (let index = 0; index < content.length; index += 1) {
      const part: unknown = content[index];
      const type = typeof part === "object" && part !== null ? (part as { type?: unknown }).type : undefined;
      if (type === "image_url") {
        found ??= [];
        found.push({ message, index, part: part as Record<string, unknown> });
      } else if (typeof type !== "string" || !TEXT_PARTS.has(type)) {
        throw unsupportedPart(`messages[${message}].content[${index}]`, part, type);
      }
    }
  }
  return found;
}

function unsupportedPart(param: string, part: unknown, type: unknown): BadRequestError {
  const what =
    typeof part !== "object" || part === null ? "not an object" : typeof type === "string" ? `a part of type '${printable(type)}'` : "a part without a type";
  return new BadRequestError(
    `${param} is ${what}; llmgw takes ${ACCEPTED_PARTS} parts in a message's content. It checks images and sends them on as data URLs, and does not pass other media (audio, video, files), which no check here would see and an engine might fetch from its own network. Send the content as text, and images as {"type":"image_url","image_url":{"url":...}} parts.`,
    { code: "unsupported_content_part", param: typeof type === "string" ? `${param}.type` : param },
  );
}

function partParam(at: ImagePart): string {
  return `messages[${at.message}].content[${at.index}]`;
}

function noVision(model: string, param: string): BadRequestError {
  return new BadRequestError(
    `Model '${model}' takes no images (${param} is an image_url part): its catalog entry does not have vision (capabilities.vision), so the engines llmgw runs for it read no images. A GGUF model reads them through its vision projector: serve it with one on a node with llama-server ('llmgw ctl model serve REPO --projector'). If every engine serving it does read images, set capabilities.vision ('llmgw ctl model edit ${model} --patch {"capabilities":{"vision":true}}').`,
    { code: "model_has_no_vision", param },
  );
}

/**
 * The URL of an image part: `image_url: {"url": ...}` as OpenAI sends it, or `image_url:
 * "..."` as vLLM also takes it (which llama-server does not read: such parts are rewritten
 * to OpenAI's shape).
 */
function urlOf(at: ImagePart): { url: string; param: string; stringForm: boolean } {
  const value = at.part.image_url;
  const param = `${partParam(at)}.image_url`;
  if (typeof value === "string") return { url: value, param, stringForm: true };
  const url = typeof value === "object" && value !== null ? (value as { url?: unknown }).url : undefined;
  if (typeof url !== "string" || url === "") {
    throw new BadRequestError(
      `${param}.url: an image_url part needs a URL: {"type":"image_url","image_url":{"url":"data:image/png;base64,..."}} or an http(s) URL.`,
      { code: "invalid_image_url", param: `${param}.url` },
    );
  }
  return { url, param: `${param}.url`, stringForm: false };
}

function invalidImage(param: string, code: string, message: string): BadRequestError {
  return new BadRequestError(`${param}: ${message}`, { code, param });
}

/** The decoded length of canonical base64 of `length` characters ending in `padding` '='s. */
function decodedLength(length: number, padding: number): number {
  return (length / 4) * 3 - padding;
}

/**
 * Refuses a data URL that is not an image llama.cpp decodes: its media type, base64 that is
 * not strict (standard alphabet, padded, nothing else), a decoded size over the limit, or
 * bytes that do not start like the formats it decodes. Only the first bytes are decoded.
 */
export function checkDataUrl(url: string, param: string, maxBytes: number): void {
  const comma = url.indexOf(",");
  const header = (comma === -1 ? url.slice(5, 200) : url.slice(5, comma)).toLowerCase();
  const [mediaType = "", ...parameters] = header.split(";");
  const format = MEDIA_TYPES[mediaType];
  if (format === "webp") throw invalidImage(param, "unsupported_image_format", `the image is WebP (image/webp): ${WEBP_ADVICE}.`);
  if (format === undefined) {
    const what = mediaType === "" ? "no media type" : `'${printable(mediaType)}'`;
    const advice = mediaType.startsWith("image/") ? `an image format llama.cpp does not decode; send ${SUPPORTED}` : `not an image; send ${SUPPORTED}`;
    throw invalidImage(param, mediaType.startsWith("image/") ? "unsupported_image_format" : "not_an_image", `the data URL declares ${what}: ${advice}.`);
  }
  if (comma === -1 || parameters.at(-1) !== "base64") {
    throw invalidImage(param, "invalid_image_url", `an image data URL must be base64: data:${mediaType};base64,<the image's bytes in base64>.`);
  }
  const start = comma + 1;
  const length = url.length - start;
  const firstPad = url.indexOf("=", start);
  const padding = firstPad === -1 ? 0 : url.length - firstPad;
  // One scan for a character outside the alphabet is ~10x faster on a 10 MiB image than an
  // anchored pattern; the '=' rule is checked by position.
  if (
    length % 4 !== 0 ||
    padding > 2 ||
    /[^A-Za-z0-9+/=]/.test(url.slice(start)) ||
    url.slice(firstPad === -1 ? url.length : firstPad) !== "=".repeat(padding)
  ) {
    throw invalidImage(
      param,
      "invalid_image_url",
      "the data URL's data is not strict base64: use the standard alphabet (A-Z, a-z, 0-9, +, /), pad with '=' to a multiple of 4 characters, and leave out line breaks and spaces.",
    );
  }
  const bytes = decodedLength(length, padding);
  if (bytes > maxBytes) {
    throw invalidImage(
      param,
      "image_too_large",
      `the image is ${formatBytes(bytes)}, over the limit of ${formatBytes(maxBytes)} an image may have (--max-image-bytes). Send a smaller image.`,
    );
  }
  // 24 characters are the first 18 bytes: enough for every signature below.
  checkImageBytes(Buffer.from(url.slice(start, start + 24), "base64"), param, "the data URL's bytes");
}

/** The format the bytes start like, or null. */
export function detectFormat(bytes: Uint8Array): Format | null {
  const starts = (...signature: number[]) => signature.every((byte, at) => bytes[at] === byte);
  if (starts(0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)) return "png";
  if (starts(0xff, 0xd8, 0xff)) return "jpeg";
  if (starts(0x47, 0x49, 0x46, 0x38) && (bytes[4] === 0x37 || bytes[4] === 0x39) && bytes[5] === 0x61) return "gif";
  // "BM" alone starts ordinary text too: stb_image also wants a known DIB header size at 14.
  if (
    starts(0x42, 0x4d) &&
    bytes.length >= 18 &&
    [12, 40, 56, 108, 124].includes(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).readUInt32LE(14))
  ) {
    return "bmp";
  }
  if (starts(0x52, 0x49, 0x46, 0x46) && bytes[8] === 0x57 && bytes[9] === 0x45 && bytes[10] === 0x42 && bytes[11] === 0x50) return "webp";
  return null;
}

/** The format of bytes that must be an image llama.cpp decodes (400 otherwise). */
function checkImageBytes(bytes: Buffer, param: string, what: string): keyof typeof FORMATS {
  const format = detectFormat(bytes);
  if (format === "webp") throw invalidImage(param, "unsupported_image_format", `the image is WebP: ${WEBP_ADVICE}.`);
  if (format === null)
    throw invalidImage(param, "not_an_image", `${what} are not an image: they do not start like ${SUPPORTED}, the formats llama.cpp decodes.`);
  return format;
}

function remoteUrl(url: string, param: string, settings: ImageSettings): URL {
  const parsed = /^https?:/i.test(url) && URL.canParse(url) ? new URL(url) : null;
  if (parsed === null) {
    throw invalidImage(param, "invalid_image_url", `'${printable(url)}' is neither a data URL (data:image/png;base64,...) nor an http(s) URL.`);
  }
  if (settings.urls === "refuse") {
    throw invalidImage(
      param,
      "image_urls_refused",
      "this server does not fetch image URLs (--image-urls refuse); send the image itself as a data URL: data:image/png;base64,<its bytes in base64>.",
    );
  }
  checkRemoteImageUrl(parsed, param, settings.allowPrivate, settings.network ?? INTERNET);
  return parsed;
}

/**
 * Fetches every URL at once under one deadline, checks the bytes, and builds the body with
 * data URLs in OpenAI's shape. `bodyBytes` is what the body holds before any image is
 * fetched; each fetched byte adds its base64 to it, and the request stops once that would
 * pass --max-body. The bytes it fetched are the process budget's until the body is built.
 */
async function inlineImages(request: {
  body: GatewayRequestBody;
  rewrites: readonly Rewrite[];
  settings: ImageSettings;
  cancel: AbortSignal;
  bodyBytes: number;
}): Promise<{ body: GatewayRequestBody; raw: Buffer }> {
  const { rewrites, settings } = request;
  const maxBody = settings.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const budget = settings.fetchBudget ?? PROCESS_IMAGE_FETCH_BUDGET;
  const firstFetched = rewrites.find((rewrite) => rewrite.fetch !== null)?.fetch?.param ?? null;
  let bodyBytes = request.bodyBytes;
  let held = 0;
  const charge = (param: string) => (bytes: number) => {
    bodyBytes += bytes * BASE64_GROWTH;
    if (bodyBytes > maxBody) throw overMaxBody(param, maxBody);
    if (!budget.take(bytes, held)) throw fetchBusy(budget);
    held += bytes;
  };
  // The first image that fails ends the others' fetches (and their lookups): its error is the answer.
  const failed = new AbortController();
  const deadline = AbortSignal.timeout(settings.fetchTimeoutMs);
  const dispatcher =
    firstFetched === null
      ? null
      : imageAgent({
          allowPrivate: settings.allowPrivate,
          resolve: settings.resolve ?? defaultResolve,
          network: settings.network ?? INTERNET,
          signal: AbortSignal.any([deadline, request.cancel, failed.signal]),
        });
  try {
    const urls = await Promise.all(
      rewrites.map(async ({ fetch, url }) => {
        if (fetch === null || dispatcher === null) return url;
        const what = `the bytes at ${printable(fetch.url.href)}`;
        try {
          const fetched = await fetchImage({
            url: fetch.url,
            param: fetch.param,
            maxBytes: settings.maxBytes,
            timeoutMs: settings.fetchTimeoutMs,
            deadline,
            cancel: AbortSignal.any([request.cancel, failed.signal]),
            dispatcher,
            allowPrivate: settings.allowPrivate,
            network: settings.network ?? INTERNET,
            charge: charge(fetch.param),
            checkHead: (head) => void checkImageBytes(head, fetch.param, what),
          });
          return `data:${FORMATS[checkImageBytes(fetched.head, fetch.param, what)]};base64,${fetched.base64}`;
        } catch (error) {
          failed.abort();
          throw error;
        }
      }),
    );
    const sent = withUrls(request.body, rewrites, urls);
    // The count above leaves out what is not an image when the body's own size was not
    // given (and each part's few bytes of JSON): the body as built has the last word.
    if (sent.raw.length > maxBody) throw overMaxBody(firstFetched ?? "messages", maxBody);
    return sent;
  } finally {
    budget.give(held);
    if (dispatcher !== null) void dispatcher.destroy().catch(() => undefined);
  }
}

function overMaxBody(param: string, maxBody: number): BadRequestError {
  return new BadRequestError(
    `${param}: with its images sent on as data URLs (base64, 4/3 of an image's size), the request would be over ${formatBytes(maxBody)}, the largest request body this server takes (--max-body). Send fewer or smaller images, or ask the operator to raise --max-body.`,
    { code: "images_over_max_body", param },
  );
}

function fetchBusy(budget: ImageFetchBudget): UnavailableError {
  return new UnavailableError(
    `llmgw is fetching ${formatBytes(budget.inUse)} of images for other requests, as much as it fetches at once (${formatBytes(budget.limitBytes)}). Try again in a moment, or send the images as data URLs.`,
    { code: "image_fetch_busy", retryAfterSeconds: 2 },
  );
}

/** A copy of the body with each rewritten part's URL replaced (the other messages and parts are shared, not copied). */
function withUrls(body: GatewayRequestBody, rewrites: readonly Rewrite[], urls: readonly string[]): { body: GatewayRequestBody; raw: Buffer } {
  const messages = [...(body.messages as unknown[])];
  const copied = new Set<number>();
  rewrites.forEach(({ at }, position) => {
    if (!copied.has(at.message)) {
      const message = messages[at.message] as { content: unknown[] };
      messages[at.message] = { ...message, content: [...message.content] };
      copied.add(at.message);
    }
    const image = at.part.image_url;
    const fields = typeof image === "object" && image !== null ? image : {};
    (messages[at.message] as { content: unknown[] }).content[at.index] = { ...at.part, image_url: { ...fields, url: urls[position] } };
  });
  const rewritten = { ...body, messages };
  // The bytes the limits and the usage estimate measure must be this body's, not the one
  // that arrived: the image parts they discount are now data URLs.
  return { body: rewritten, raw: Buffer.from(JSON.stringify(rewritten)) };
}
