// Command decode measures Go's decode floor on the benchmark's watch stream, and checks that
// client-go reads the stream server's protobuf as it reads the API server's.
//
// `-mode floor` reads `-updates` watch events from the stream server into memory (in the
// `-content-type` asked for), then decodes the whole buffer `-rounds` times along each path
// and prints events/s per round:
//   - json: client-go's watch decoder (the JSON framer, the streaming decoder of the
//     metav1.WatchEvent envelope, then the typed decode of the object, exactly what
//     rest.Request.Watch builds), and a bare encoding/json Unmarshal of each line into
//     {Type string; Object corev1.ConfigMap};
//   - protobuf: client-go's watch decoder (the length-delimited framer, the raw protobuf
//     WatchEvent, the object's k8s\0 + runtime.Unknown + corev1.ConfigMap), and a bare
//     gogo-protobuf Unmarshal of each frame's WatchEvent, Unknown and ConfigMap.
//
// Each path reads the sequence annotation of every object, as the informers' handlers do. No
// informer, no store, no HTTP during the timing: the floor under the informer rows.
//
// `-mode check` lists and watches through client-go's typed clients in protobuf and JSON and
// re-encodes what it read with apimachinery's protobuf serializers: the bytes must be the
// server's, byte for byte (what an API server sends for the same objects), and the two
// encodings must carry the same objects. It prints {"ok": true, ...} or an error line.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restclientwatch "k8s.io/client-go/rest/watch"

	"wasmctrl.example/bench/anchors/internal/measure"
)

const (
	jsonType     = "application/json"
	protobufType = "application/vnd.kubernetes.protobuf"
)

func main() {
	if err := os.Setenv("KUBE_FEATURE_WatchListClient", "false"); err != nil {
		measure.Fail(err)
	}
	mode := flag.String("mode", "floor", "floor or check")
	url := flag.String("url", "", "the stream server, http://127.0.0.1:PORT")
	rawURL := flag.String("raw-url", "", "check: a second stream server, for the raw protobuf watch")
	objects := flag.Int("objects", 20000, "objects in the initial list")
	updates := flag.Int("updates", 200000, "updates to read")
	contentType := flag.String("content-type", "json", "floor: json or protobuf")
	rounds := flag.Int("rounds", 3, "floor: decode passes over the buffer")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if *url == "" || *objects <= 0 || *updates <= 0 {
		measure.Fail(fmt.Errorf("usage: decode -mode floor|check -url URL -objects N -updates M"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch *mode {
	case "floor":
		err = floor(ctx, *url, *contentType, *updates, *rounds)
	case "check":
		err = check(ctx, *url, *rawURL, *objects, *updates)
	default:
		err = fmt.Errorf("-mode %q: want floor or check", *mode)
	}
	if err != nil {
		measure.Fail(err)
	}
}

func mediaType(contentType string) (string, error) {
	switch contentType {
	case "json":
		return jsonType, nil
	case "protobuf":
		return protobufType, nil
	}
	return "", fmt.Errorf("-content-type %q: want json or protobuf", contentType)
}

// listRV lists through a typed client and returns the list's resourceVersion.
func listRV(ctx context.Context, url string) (string, error) {
	clientset, err := kubernetes.NewForConfig(&rest.Config{Host: url, ContentConfig: rest.ContentConfig{ContentType: jsonType}})
	if err != nil {
		return "", err
	}
	list, err := clientset.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	return list.ResourceVersion, nil
}

// rawWatch opens the watch from the list's resourceVersion with Accept: accept.
func rawWatch(ctx context.Context, url, rv, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		url+"/api/v1/configmaps?watch=true&resourceVersion="+rv, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("watch: %s", resp.Status)
	}
	return resp, nil
}

// readEvents reads exactly n events' bytes off a watch body (the stream stays open after
// the last update, so it cannot be read to its end).
func readEvents(body io.Reader, media string, n int) ([]byte, error) {
	r := bufio.NewReaderSize(body, 1<<20)
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		if media == jsonType {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, fmt.Errorf("after %d events: %w", i, err)
			}
			buf.Write(line)
			continue
		}
		var header [4]byte
		if _, err := io.ReadFull(r, header[:]); err != nil {
			return nil, fmt.Errorf("after %d frames: %w", i, err)
		}
		frame := make([]byte, int(uint32(header[0])<<24|uint32(header[1])<<16|uint32(header[2])<<8|uint32(header[3])))
		if _, err := io.ReadFull(r, frame); err != nil {
			return nil, fmt.Errorf("frame %d: %w", i, err)
		}
		buf.Write(header[:])
		buf.Write(frame)
	}
	return buf.Bytes(), nil
}

var sink int

func seqOf(cm *corev1.ConfigMap) {
	sink += len(cm.Annotations[measure.SeqAnnotation])
}

// watchDecoder is the decoder rest.Request.Watch builds for media.
func watchDecoder(stream []byte, media string) (*restclientwatch.Decoder, error) {
	gv := schema.GroupVersion{Version: "v1"}
	negotiator := runtime.NewClientNegotiator(
		rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion(), gv)
	objectDecoder, streamingSerializer, framer, err := negotiator.StreamDecoder(media, nil)
	if err != nil {
		return nil, err
	}
	frames := framer.NewFrameReader(io.NopCloser(bytes.NewReader(stream)))
	return restclientwatch.NewDecoder(streaming.NewDecoder(frames, streamingSerializer), objectDecoder), nil
}

func clientGoPath(stream []byte, media string, n int) (int, error) {
	d, err := watchDecoder(stream, media)
	if err != nil {
		return 0, err
	}
	seen := 0
	for {
		_, obj, err := d.Decode()
		if err == io.EOF {
			break
		}
		if err != nil {
			return seen, fmt.Errorf("event %d: %w", seen, err)
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return seen, fmt.Errorf("event %d: %T", seen, obj)
		}
		seqOf(cm)
		seen++
	}
	if seen != n {
		return seen, fmt.Errorf("decoded %d of %d events", seen, n)
	}
	return seen, nil
}

func jsonUnmarshalPath(stream []byte, n int) (int, error) {
	seen := 0
	for len(stream) > 0 {
		end := bytes.IndexByte(stream, '\n')
		if end < 0 {
			end = len(stream)
		}
		var ev struct {
			Type   string
			Object corev1.ConfigMap
		}
		if err := json.Unmarshal(stream[:end], &ev); err != nil {
			return seen, fmt.Errorf("line %d: %w", seen, err)
		}
		seqOf(&ev.Object)
		seen++
		stream = stream[min(end+1, len(stream)):]
	}
	if seen != n {
		return seen, fmt.Errorf("decoded %d of %d lines", seen, n)
	}
	return seen, nil
}

func protobufUnmarshalPath(stream []byte, n int) (int, error) {
	seen := 0
	for len(stream) >= 4 {
		size := int(uint32(stream[0])<<24 | uint32(stream[1])<<16 | uint32(stream[2])<<8 | uint32(stream[3]))
		frame := stream[4 : 4+size]
		stream = stream[4+size:]
		var ev metav1.WatchEvent
		if err := ev.Unmarshal(frame); err != nil {
			return seen, fmt.Errorf("frame %d: %w", seen, err)
		}
		raw := ev.Object.Raw
		if !bytes.HasPrefix(raw, []byte("k8s\x00")) {
			return seen, fmt.Errorf("frame %d: no k8s\\0 prefix", seen)
		}
		var unknown runtime.Unknown
		if err := unknown.Unmarshal(raw[4:]); err != nil {
			return seen, fmt.Errorf("frame %d: %w", seen, err)
		}
		var cm corev1.ConfigMap
		if err := cm.Unmarshal(unknown.Raw); err != nil {
			return seen, fmt.Errorf("frame %d: %w", seen, err)
		}
		seqOf(&cm)
		seen++
	}
	if seen != n {
		return seen, fmt.Errorf("decoded %d of %d frames", seen, n)
	}
	return seen, nil
}

func floor(ctx context.Context, url, contentType string, n, rounds int) error {
	media, err := mediaType(contentType)
	if err != nil {
		return err
	}
	rv, err := listRV(ctx, url)
	if err != nil {
		return err
	}
	resp, err := rawWatch(ctx, url, rv, media)
	if err != nil {
		return err
	}
	stream, err := readEvents(resp.Body, media, n)
	resp.Body.Close()
	if err != nil {
		return err
	}
	paths := map[string]func() (int, error){
		"client-go watch decoder": func() (int, error) { return clientGoPath(stream, media, n) },
	}
	if media == jsonType {
		paths["encoding/json Unmarshal"] = func() (int, error) { return jsonUnmarshalPath(stream, n) }
	} else {
		paths["gogo-protobuf Unmarshal"] = func() (int, error) { return protobufUnmarshalPath(stream, n) }
	}
	figures := map[string][]float64{}
	for round := 0; round < rounds; round++ {
		for name, path := range paths {
			start := time.Now()
			seen, err := path()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			figures[name] = append(figures[name], float64(seen)/time.Since(start).Seconds())
		}
	}
	measure.Emit(map[string]any{
		"impl":            "go-decode",
		"content_type":    contentType,
		"wire":            []string{resp.Header.Get("Content-Type")},
		"events":          n,
		"bytes_per_event": float64(len(stream)) / float64(n),
		"events_per_sec":  figures,
		"env":             measure.Environment(),
	})
	return nil
}

// reencode is what apimachinery's protobuf serializer writes for obj.
func reencode(obj runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(obj, &buf)
	return buf.Bytes(), err
}

// withoutStamp drops what differs between two lists of the same objects: the per-request
// sent stamp, and the items' apiVersion/kind, which a protobuf list item does not carry
// (the corpus's JSON items do).
func withoutStamp(items []corev1.ConfigMap) []corev1.ConfigMap {
	out := make([]corev1.ConfigMap, len(items))
	for i, cm := range items {
		c := cm.DeepCopy()
		delete(c.Annotations, measure.SentAnnotation)
		c.TypeMeta = metav1.TypeMeta{}
		out[i] = *c
	}
	return out
}

func check(ctx context.Context, url, rawURL string, objects, updates int) error {
	if rawURL == "" {
		return fmt.Errorf("check needs -raw-url (a second stream server)")
	}
	typed := func(contentType string) (*kubernetes.Clientset, *measure.ContentTypes, error) {
		var wire measure.ContentTypes
		c, err := kubernetes.NewForConfig(&rest.Config{Host: url, ContentConfig: rest.ContentConfig{ContentType: contentType}, WrapTransport: wire.Wrap})
		return c, &wire, err
	}
	pbClient, pbWire, err := typed(protobufType)
	if err != nil {
		return err
	}
	jsonClient, _, err := typed(jsonType)
	if err != nil {
		return err
	}

	// The list: the same objects in both encodings (but for the per-request stamp).
	pbList, err := pbClient.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("protobuf list: %w", err)
	}
	jsonList, err := jsonClient.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("JSON list: %w", err)
	}
	if len(pbList.Items) != objects || pbList.ResourceVersion != jsonList.ResourceVersion {
		return fmt.Errorf("protobuf list: %d items at %q, want %d at %q",
			len(pbList.Items), pbList.ResourceVersion, objects, jsonList.ResourceVersion)
	}
	pbItems, jsonItems := withoutStamp(pbList.Items), withoutStamp(jsonList.Items)
	for i := range pbItems {
		if !reflect.DeepEqual(pbItems[i], jsonItems[i]) {
			return fmt.Errorf("list item %d differs: protobuf %+v, JSON %+v", i, pbItems[i], jsonItems[i])
		}
	}

	// The list's bytes: what apimachinery's serializer writes for what it decoded.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/configmaps?resourceVersion=0", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", protobufType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	rawList, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if got := resp.Header.Get("Content-Type"); got != protobufType {
		return fmt.Errorf("list Content-Type %q", got)
	}
	decoded, _, err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Decode(rawList, nil, nil)
	if err != nil {
		return fmt.Errorf("decoding the raw protobuf list: %w", err)
	}
	again, err := reencode(decoded)
	if err != nil {
		return err
	}
	if !bytes.Equal(again, rawList) {
		return fmt.Errorf("the protobuf list's bytes differ from apimachinery's encoding (%d vs %d bytes)", len(rawList), len(again))
	}

	// The typed protobuf watch: every update, in order, as sent.
	w, err := pbClient.CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{ResourceVersion: pbList.ResourceVersion})
	if err != nil {
		return fmt.Errorf("protobuf watch: %w", err)
	}
	defer w.Stop()
	listRV, err := strconv.Atoi(pbList.ResourceVersion)
	if err != nil {
		return fmt.Errorf("list resourceVersion %q: %w", pbList.ResourceVersion, err)
	}
	for u := 0; u < updates; u++ {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			return fmt.Errorf("protobuf watch: %d of %d updates: %w", u, updates, ctx.Err())
		}
		cm, ok := ev.Object.(*corev1.ConfigMap)
		if !ok || ev.Type != watch.Modified {
			return fmt.Errorf("protobuf watch event %d: %s %T", u, ev.Type, ev.Object)
		}
		wantName := fmt.Sprintf("cm-%d", u%objects)
		wantRev := strconv.Itoa(u/objects + 1)
		if cm.Name != wantName || cm.Annotations[measure.SeqAnnotation] != strconv.Itoa(u) ||
			cm.ResourceVersion != strconv.Itoa(listRV+1+u) || cm.Data["revision"] != wantRev {
			return fmt.Errorf("protobuf watch event %d: %s rv %s seq %q revision %q", u, cm.Name,
				cm.ResourceVersion, cm.Annotations[measure.SeqAnnotation], cm.Data["revision"])
		}
	}

	// The raw protobuf watch: each frame and each object re-encode to the same bytes.
	rawResp, err := rawWatch(ctx, rawURL, pbList.ResourceVersion, protobufType)
	if err != nil {
		return err
	}
	defer rawResp.Body.Close()
	if got := rawResp.Header.Get("Content-Type"); got != protobufType+";stream=watch" {
		return fmt.Errorf("watch Content-Type %q", got)
	}
	stream, err := readEvents(rawResp.Body, protobufType, updates)
	if err != nil {
		return err
	}
	rawSerializer := protobuf.NewRawSerializer(scheme.Scheme, scheme.Scheme)
	for u := 0; len(stream) > 0; u++ {
		size := int(uint32(stream[0])<<24 | uint32(stream[1])<<16 | uint32(stream[2])<<8 | uint32(stream[3]))
		frame := stream[4 : 4+size]
		stream = stream[4+size:]
		var ev metav1.WatchEvent
		if _, _, err := rawSerializer.Decode(frame, nil, &ev); err != nil {
			return fmt.Errorf("frame %d: %w", u, err)
		}
		var frameAgain bytes.Buffer
		if err := rawSerializer.Encode(&ev, &frameAgain); err != nil {
			return err
		}
		if !bytes.Equal(frameAgain.Bytes(), frame) {
			return fmt.Errorf("frame %d's bytes differ from apimachinery's encoding", u)
		}
		obj, _, err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Decode(ev.Object.Raw, nil, nil)
		if err != nil {
			return fmt.Errorf("frame %d's object: %w", u, err)
		}
		objAgain, err := reencode(obj)
		if err != nil {
			return err
		}
		if !bytes.Equal(objAgain, ev.Object.Raw) {
			return fmt.Errorf("frame %d's object bytes differ from apimachinery's encoding", u)
		}
	}
	measure.Emit(map[string]any{
		"ok":      true,
		"listed":  len(pbList.Items),
		"watched": updates,
		"wire":    pbWire.Seen(),
		"env":     measure.Environment(),
	})
	return nil
}
