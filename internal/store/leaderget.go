package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// leaderMsg is a stream message as STREAM.MSG.GET returns it: headers
// as NATS encodes them (NATS/1.0, then lines) and data, base64 in the
// reply.
type leaderMsg struct {
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	Header  []byte `json:"hdrs"`
	Data    []byte `json:"data"`
}

// leaderGet asks stream's leader for one message (req: {"seq": N} or
// {"last_by_subj": S}); jetstream.ErrMsgNotFound where it has none.
// Direct gets, which any replica answers, may miss what a lagging one
// has not stored yet; the leader does not. A server that cannot answer
// (not the leader, the stream not yet assigned to it) drops the request
// unanswered: bounded as jetstream's own calls are.
func leaderGet(ctx context.Context, js jetstream.JetStream, stream string, req any) (*leaderMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, js.Options().DefaultTimeout)
	defer cancel()
	msg, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *leaderMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("empty reply")
	}
	return resp.Message, nil
}

// apiPrefix is the JetStream API subject prefix js uses.
func apiPrefix(js jetstream.JetStream) string {
	if p := js.Options().APIPrefix; p != "" {
		return p
	}
	return jetstream.DefaultAPIPrefix
}
