/** JSON and label-selector helpers of the fake imports. */

export function encodeJson(value: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value));
}

export function decodeJson<T>(bytes: Uint8Array): T {
  return JSON.parse(new TextDecoder().decode(bytes)) as T;
}

/** Throws what a WIT import throws for an error case. */
export function fail(tag: "not-found" | "already-exists" | "conflict" | "invalid", message: string): never {
  throw { payload: { tag, val: message } };
}

/**
 * Whether `labels` match `selector`: the equality-based requirements (`k=v`, `k==v`, `k!=v`,
 * `k`, `!k`, comma-joined). Set-based ones (`in`, `notin`) are not modelled and fail as
 * `invalid`, so a test never passes on a selector the fake misread.
 */
export function selects(selector: string | undefined, labels: Record<string, string>): boolean {
  if (selector === undefined || selector.trim() === "") return true;
  return selector.split(",").every((raw) => {
    const part = raw.trim();
    if (/\s(in|notin)\s*\(/.test(part)) {
      fail("invalid", `the fake host does not model set-based selectors: ${part}`);
    }
    const ne = part.indexOf("!=");
    if (ne >= 0) return labels[part.slice(0, ne).trim()] !== part.slice(ne + 2).trim();
    const eq = part.indexOf("=");
    if (eq >= 0) {
      const value = part.slice(part.startsWith("==", eq) ? eq + 2 : eq + 1).trim();
      return labels[part.slice(0, eq).trim()] === value;
    }
    if (part.startsWith("!")) return !(part.slice(1).trim() in labels);
    return part in labels;
  });
}

/** RFC 7386 merge of `patch` into `target`. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== "object" || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> =
    target !== null && typeof target === "object" && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch as Record<string, unknown>)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}
