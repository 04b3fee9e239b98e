; placement-logic proof obligation: correctness/sufficiency
; theorem: Correctness
; GI ∧ SC ⇒ equivalence (every update rule U)
;   ∀ U, C (deterministic update and clip rules), ∀ θ, θ_d, θ_o, g*, ĝ_d, ĝ_o, ν*, ν_d, ν_o, f*, f_d, f_o, own_d, rg_d:
;     GI:  (own_d ⇒ ĝ_d = g*) ∧ ĝ_o = g*
;     SC:  θ_d = θ ∧ θ_o = θ ∧ (own_d ⇒ ν_d = ν* ∧ f_d = f*) ∧ ν_o = ν* ∧ f_o = f* ∧ (own_d ∨ rg_d)
;     ⇒ θ'_d = θ'*,  where step(θ, g, ν, f) = if f then θ else U(θ, g, C(ν)),
;     θ'* = step(θ, g*, ν*, f*),  θ'_d = if own_d then step(θ_d, ĝ_d, ν_d, f_d) else if rg_d then step(θ_o, ĝ_o, ν_o, f_o) else θ_d
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun g_star () Real)
(declare-fun g_o () Real)
(declare-fun g_d () Real)
(declare-fun own_d () Bool)
(declare-fun rg_d () Bool)
(declare-fun f_star () Bool)
(declare-fun f_o () Bool)
(declare-fun nu_star () Real)
(declare-fun nu_o () Real)
(declare-fun f_d () Bool)
(declare-fun nu_d () Real)
(declare-fun theta () Real)
(declare-fun theta_o () Real)
(declare-fun theta_d () Real)
(declare-fun U (Real Real Real) Real)
(declare-fun C (Real) Real)
(assert
 (let (($x0 (= g_o g_star)))
 (and (=> own_d (= g_d g_star)) $x0)))
(assert
 (let (($x1 (or own_d rg_d)))
 (let (($x2 (= f_o f_star)))
 (let (($x3 (= nu_o nu_star)))
 (let (($x4 (= theta_o theta)))
 (let (($x5 (= theta_d theta)))
 (and $x5 $x4 (=> own_d (and (= nu_d nu_star) (= f_d f_star))) $x3 $x2 $x1)))))))
(assert
 (let ((?x0 (ite f_star theta (U theta g_star (C nu_star)))))
(let ((?x1 (ite rg_d (ite f_o theta_o (U theta_o g_o (C nu_o))) theta_d)))
(let ((?x2 (ite own_d (ite f_d theta_d (U theta_d g_d (C nu_d))) ?x1)))
(and (distinct ?x2 ?x0) true)))))
(check-sat)
(exit)
