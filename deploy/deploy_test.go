// Package deploy_test keeps the deployment files honest: the Envoy config
// is a valid bootstrap whose route actions produce descriptors the example
// rules limit; the Kubernetes manifests, compose file, alerts and
// dashboard reference what exists.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// yamlDocs decodes every document of a YAML file into JSON-shaped values.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, d)
	}
}

func loadBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := json.Marshal(yamlDocs(t, "envoy.yaml")[0])
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not a Bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation: %v", err)
	}
	return &b
}

func TestEnvoyConfigMatchesRules(t *testing.T) {
	b := loadBootstrap(t)
	rules, err := config.Load("rules")
	if err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitv3.RateLimit
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	dom := rules.Domain(rl.GetDomain())
	if dom == nil {
		t.Fatalf("the filter's domain %q is in no rules file", rl.GetDomain())
	}
	if rl.GetTimeout().AsDuration() <= 0 || rl.GetFailureModeDeny() {
		t.Errorf("timeout %v, failure_mode_deny %v", rl.GetTimeout().AsDuration(), rl.GetFailureModeDeny())
	}
	if rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "ratelimitd" {
		t.Error("the filter does not call the ratelimitd cluster")
	}
	// Sample request values per header; each route's actions must produce
	// a descriptor the rules limit.
	headers := map[string]string{"x-api-key": "k-123", "user-agent": "googlebot/2.1"}
	for _, r := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		path := r.GetMatch().GetPath()
		if path == "" {
			path = r.GetMatch().GetPrefix() + "anything"
		}
		for _, lim := range r.GetRoute().GetRateLimits() {
			entries := descriptor(t, lim.GetActions(), path, headers)
			rule := dom.Match(entries)
			if rule == nil || rule.Limit == nil {
				t.Errorf("route %s: actions produce %v, which no rule limits", path, entries)
				continue
			}
			t.Logf("route %-20s -> %-45v -> %s", path, entries, rule.Path)
		}
	}
}

// descriptor produces the entries Envoy sends for actions.
func descriptor(t *testing.T, actions []*routev3.RateLimit_Action, path string, headers map[string]string) []*rlcommon.RateLimitDescriptor_Entry {
	var out []*rlcommon.RateLimitDescriptor_Entry
	for _, a := range actions {
		switch {
		case a.GetRemoteAddress() != nil:
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: "remote_address", Value: "10.0.0.1"})
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			v := headers[h.GetHeaderName()]
			if h.GetHeaderName() == ":path" {
				v = path
			}
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: h.GetDescriptorKey(), Value: v})
		case a.GetGenericKey() != nil:
			k := a.GetGenericKey().GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: a.GetGenericKey().GetDescriptorValue()})
		default:
			t.Fatalf("action %v not modelled by this test", a)
		}
	}
	return out
}

func TestKubernetes(t *testing.T) {
	docs := yamlDocs(t, "kubernetes/ratelimitd.yaml")
	kinds := map[string]map[string]any{}
	for _, d := range docs {
		kinds[d["kind"].(string)] = d
	}
	for _, k := range []string{"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} {
		if kinds[k] == nil {
			t.Fatalf("no %s", k)
		}
	}
	// The ConfigMap carries the example rules, unchanged and valid.
	cm := kinds["ConfigMap"]["data"].(map[string]any)["example.yaml"].(string)
	example, _ := os.ReadFile("rules/example.yaml")
	if cm != string(example) {
		t.Error("the ConfigMap's rules differ from deploy/rules/example.yaml")
	}
	if _, err := config.Parse("configmap", []byte(cm)); err != nil {
		t.Error(err)
	}
	dep, _ := json.Marshal(kinds["Deployment"])
	for _, want := range []string{`"containerPort":8081`, `"containerPort":8080`, `"path":"/healthcheck"`,
		`"--config=/etc/ratelimitd/rules"`, `"mountPath":"/etc/ratelimitd/rules"`, `"healthcheck","--addr=127.0.0.1:8081"`,
		`"name":"ratelimitd-rules"`, `"prometheus.io/path":"/metrics"`} {
		if !strings.Contains(string(dep), want) {
			t.Errorf("Deployment lacks %s", want)
		}
	}
	svc, _ := json.Marshal(kinds["Service"])
	for _, want := range []string{`"port":8081`, `"port":8080`, `"targetPort":"grpc"`} {
		if !strings.Contains(string(svc), want) {
			t.Errorf("Service lacks %s", want)
		}
	}
}

func TestCompose(t *testing.T) {
	c := yamlDocs(t, "docker-compose.yaml")[0]
	js, _ := json.Marshal(c)
	for _, want := range []string{`"--redis-url=redis://redis:6379"`, `"./rules:/etc/ratelimitd/rules:ro"`, `"./envoy.yaml:/etc/envoy/envoy.yaml:ro"`, `"noeviction"`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("docker-compose.yaml lacks %s", want)
		}
	}
}
